#!/bin/bash
# The run of run.yaml as a training script in the style of Megatron-LM's examples: arrays of
# flags, a quoted string of flags, exported variables, and the launch at the end.

export CUDA_DEVICE_MAX_CONNECTIONS=1
export NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
export CUBLAS_WORKSPACE_CONFIG=:4096:8
export PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"

GPUS_PER_NODE=8
NUM_NODES=1
WORLD_SIZE=$(($GPUS_PER_NODE * $NUM_NODES))

CHECKPOINT_PATH=$1            # <path>
DATA_PATH=${2:-/data}
TP=2

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr localhost
    --master_port 29500
)

MODEL_ARGS=(
    --num-layers 8
    --hidden-size 512
    --ffn-hidden-size 1536    # 3 × 512
    --num-attention-heads 8
    --group-query-attention
    --num-query-groups 4
    --swiglu
    --normalization RMSNorm
    --position-embedding-type rope
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --seq-length 1024
    --max-position-embeddings 1024
)

MODEL_PARALLEL_ARGS=(
    --tensor_model_parallel_size=$TP
    --pipeline-model-parallel-size 2
    --sequence-parallel
)
MODEL_PARALLEL_ARGS+=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)

TRAINING_ARGS="--micro-batch-size 2 --global-batch-size 32 --bf16 \
    --recompute-granularity selective --attention-backend fused --deterministic-mode \
    --train-iters 50 --lr 0.00015 --lr-decay-style cosine"

DATA_ARGS=(
    --data-path "$DATA_PATH/my-gpt3_00_text_document"
    --vocab-file "${DATA_PATH}/vocab.json"
    --merge-file "${DATA_PATH}/merges.txt"
    --split 949,50,1
)

if [ -z "$CHECKPOINT_PATH" ]; then
    echo "usage: $0 CHECKPOINT_PATH [DATA_PATH]" >&2
fi

torchrun "${DISTRIBUTED_ARGS[@]}" pretrain_gpt.py \
    "${MODEL_ARGS[@]}" \
    "${MODEL_PARALLEL_ARGS[@]}" \
    $TRAINING_ARGS \
    "${DATA_ARGS[@]}" \
    --log-interval 1 \
    --save $CHECKPOINT_PATH --load $CHECKPOINT_PATH \
    --tensorboard-dir "${TENSORBOARD_DIR:-/tb}" \
    --use-mcore-models 2>&1 | tee train.log
