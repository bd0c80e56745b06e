#!/bin/bash
# Llama-3-70B pretraining with Megatron-LM on 16 nodes of 8 H100s: TP 8, PP 4 with 5 virtual
# stages per rank, DP 4, sequence parallel, the distributed optimizer, bf16.
#   memsim estimate --megatron-args tools/examples/megatron/llama3-70b.sh --gpu h100-80gb
#   memsim plan --megatron-args tools/examples/megatron/llama3-70b.sh --gpu h100-80gb

GPUS_PER_NODE=8
NUM_NODES=16
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

MODEL_ARGS=(
    --num-layers 80
    --hidden-size 8192
    --ffn-hidden-size 28672
    --num-attention-heads 64
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --swiglu
    --normalization RMSNorm
    --position-embedding-type rope
    --rotary-base 500000
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --seq-length 8192
    --max-position-embeddings 8192
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model meta-llama/Meta-Llama-3-70B
    --vocab-size 128256
    --attention-dropout 0.0
    --hidden-dropout 0.0
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --train-iters 250000
    --lr 1.5e-4
    --min-lr 1.5e-5
    --lr-decay-style cosine
    --weight-decay 0.1
    --clip-grad 1.0
    --bf16
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)

PARALLEL_ARGS=(
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 4
    --num-layers-per-virtual-pipeline-stage 4
    --sequence-parallel
)

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES \
    pretrain_gpt.py "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${PARALLEL_ARGS[@]}" \
    --data-path /data/llama3_text_document --save /checkpoints --load /checkpoints
