#!/bin/sh
# Writes the output of a fixed set of memsim commands (estimate, replay, compare, plan, gen,
# convert, the exports, the error messages) to one file each in OUTDIR, so that two builds can
# be compared byte for byte: `tools/outputs.sh build /tmp/a; ...; tools/outputs.sh build /tmp/b;
# diff -r /tmp/a /tmp/b`. Run from the source root. Wall times and paths are masked.
set -u
build=${1:?usage: tools/outputs.sh BUILD_DIR OUT_DIR}
out=${2:?usage: tools/outputs.sh BUILD_DIR OUT_DIR}
memsim=$(cd "$build" && pwd)/tools/memsim
mkdir -p "$out"
out=$(cd "$out" && pwd)
good=$(pwd)/tests/data/good
n=0

# run NAME ARGS...: stdout, stderr and the exit status of `memsim ARGS` into OUT/NAME.
run() {
    name=$1; shift
    n=$((n + 1))
    (cd "$out" && "$memsim" "$@" >"$name.out" 2>"$name.err"; echo "exit $?" >>"$name.err")
    sed -i -e 's/[0-9.]* s wall/N s wall/g' -e "s/[0-9.]* s on /N s on /g" -e "s/\"elapsed_s\" : [0-9.e+-]*/\"elapsed_s\": N/g" -e 's/"wall_s": *[0-9.e+-]*/"wall_s": N/g' \
        -e "s|$out|OUT|g" -e "s|$(pwd)|SRC|g" "$out/$name.out" "$out/$name.err"
}

# --- estimate, one GPU ---
run est-readme estimate --model llama-3-8b --batch 2 --seq 4096 --finetune lora --lora-rank 16 --checkpointing full --gpu-mem 80GiB
run est-json estimate --model opt-125m --batch 4 --seq 512 --json
run est-fp32-sgd estimate --model gpt2 --batch 2 --seq 256 --precision fp32 --optimizer sgd-momentum --json
run est-adafactor estimate --model opt-350m --seq 256 --optimizer adafactor --zero-grad zero --json
run est-8bit estimate --model pythia-410m --seq 512 --optimizer adamw-8bit --checkpointing selective --json
run est-qlora estimate --model llama-2-7b --seq 1024 --finetune qlora --json
run est-accum estimate --model gpt2 --seq 512 --grad-accum 3 --keep-outputs true --steps 3 --json
run est-eager estimate --model gpt-neo-125m --seq 512 --attention eager --torch-version 1.13 --json
run est-infer estimate --model llama-2-7b --inference --prompt 256 --generate 32 --json
run est-infer-4bit estimate --model mistral-7b --inference --weights 4bit --json
run est-mixtral estimate --model mixtral-8x7b --seq 512 --finetune lora --gpu-mem h100-80gb
run est-oom estimate --model llama-2-13b --seq 2048 --gpu-mem 24GiB
run est-oom-json estimate --model llama-2-13b --seq 2048 --gpu-mem 24GiB --json
run est-cpu estimate --model gpt2 --seq 128 --device cpu --json
run est-fused estimate --model opt-125m --seq 256 --optimizer-impl fused --precision fp16-mixed --json
run est-bloom estimate --model bloom-560m --seq 256 --json
run est-falcon estimate --model falcon-7b --seq 256 --finetune lora --json
run est-codegen estimate --model codegen-350m --seq 256 --json
run est-neox estimate --model pythia-410m --seq 256 --use-cache true --json
run est-alloc estimate --model opt-125m --seq 256 --allocator bfc --json
run est-conf estimate --model opt-125m --seq 256 --alloc-conf expandable_segments:True --json
# --- estimate, distributed ---
run est-ddp estimate --model opt-1.3b --gpus 4 --method ddp --seq 512 --json
run est-ddp-sgd estimate --model opt-1.3b --gpus 4 --method ddp --optimizer sgd --seq 512 --json
run est-zero1 estimate --model opt-1.3b --gpus 4 --method zero1 --seq 512 --json
run est-zero2 estimate --model opt-1.3b --gpus 4 --method zero2 --seq 512 --json
run est-zero3 estimate --model llama-2-13b --gpus 8 --method zero3 --batch 4 --gpu-mem 80GiB
run est-zero3-json estimate --model opt-1.3b --gpus 4 --method zero3 --seq 512 --json
run est-fsdp estimate --model opt-1.3b --gpus 4 --method fsdp --seq 512 --json
run est-fsdp-model estimate --model opt-1.3b --gpus 4 --method fsdp --fsdp-wrap model --seq 512 --json
run est-fsdp-grad-op estimate --model opt-1.3b --gpus 4 --method fsdp-grad-op --seq 512 --json
run est-hsdp estimate --model opt-1.3b --gpus 16 --method hsdp --seq 512 --json
run est-tp estimate --model llama-2-7b --gpus 4 --tp 4 --seq 1024 --json
run est-tp-sp estimate --model llama-2-7b --gpus 8 --tp 4 --dp 2 --sequence-parallel --seq 1024 --json
run est-pp estimate --model llama-2-7b --gpus 4 --pp 4 --seq 1024 --json
run est-pp-gpipe estimate --model llama-2-7b --gpus 4 --pp 2 --pp-schedule gpipe --microbatches 4 --seq 512 --json
run est-pp-inter estimate --model llama-2-7b --gpus 4 --pp 2 --pp-schedule interleaved --virtual-stages 2 --microbatches 4 --seq 512 --json
run est-readme-3d estimate --model llama-2-70b --gpus 64 --tp 8 --pp 4 --dp 2 --pp-schedule 1f1b --seq 4096 --batch 1 --checkpointing selective --gpu h100-80gb
run est-megatron-ckpt estimate --model gpt2-medium --gpus 4 --tp 2 --pp 2 --checkpointing full --seq 512 --json
# --- gen, convert, exports ---
run gen-mst gen --model opt-125m --seq 128 -o gen.mst
run gen-txt gen --model opt-125m --seq 128 -o gen.txt
run gen-pickle gen --model opt-125m --seq 128 -o gen.pickle
run gen-ddp-txt gen --model gpt2 --gpus 2 --method zero3 --seq 128 -o gen-zero3.txt
run gen-pp-txt gen --model gpt2 --gpus 2 --pp 2 --seq 128 -o gen-pp.txt
run gen-zero3-pickle gen --model gpt2 --gpus 2 --method zero3 --seq 128 -o gen-zero3.pickle
run gen-fsdp-pickle gen --model gpt2 --gpus 2 --method fsdp --seq 128 -o gen-fsdp.pickle
run gen-pp-pickle gen --model gpt2 --gpus 4 --tp 2 --pp 2 --seq 128 -o gen-pp.pickle
run convert-small convert "$good/small.txt" small.mst
run convert-back convert small.mst small-back.txt
run convert-pickle convert "$good/small.txt" small.pickle
run convert-nesta-pickle convert "$good/snapshot-nesta.txt" nesta.pickle
run convert-pipeline convert "$good/pipeline.txt" pipeline.pickle
run export-est estimate --model gpt2 --seq 256 --timeline est.svg --perfetto est.json --csv est.csv --report est.html
# --- replay, compare ---
for t in small pipeline raw-fields snapshot-nesta; do
    run "replay-$t" replay "$good/$t.txt"
    run "replay-$t-json" replay "$good/$t.txt" --json
    run "replay-$t-bfc" replay "$good/$t.txt" --allocator bfc --json
    run "replay-$t-conf" replay "$good/$t.txt" --alloc-conf expandable_segments:True --json
    run "compare-$t" compare "$good/$t.txt" --allocators all --json
    run "compare-$t-text" compare "$good/$t.txt" --allocators all
done
run replay-nesta-verify replay "$good/snapshot-nesta.txt" --verify
run replay-nesta-exports replay "$good/snapshot-nesta.txt" --timeline nesta.svg --perfetto nesta.json --csv nesta.csv --report nesta.html
run replay-gen replay gen.mst --json
run replay-gen-pickle replay gen.pickle --json
run compare-model compare --model opt-125m --seq 256 --allocators all --gpu-mem 2GiB --json
# --- plan ---
run plan-readme plan --threads 1 --model opt-1.3b --gpus 4 --gpu v100-16gb --precision fp16-mixed --seq 512 --methods ddp,zero3,tp
run plan-json plan --threads 1 --model opt-350m --gpus 8 --gpu a100-40gb --seq 1024 --global-batch 32 --json
run plan-csv plan --threads 1 --model gpt2 --gpus 4 --gpu v100-16gb --seq 512 --csv
run plan-mig plan --threads 1 --model opt-125m --gpus 1 --gpu a100-40gb --mig --seq 512 --global-batch 8 --json
run plan-none plan --threads 1 --model llama-2-70b --gpus 2 --gpu v100-16gb --seq 4096
# --- refusals ---
run bad-ddp-tp estimate --model gpt2 --gpus 2 --method ddp --tp 2
run bad-heads estimate --model gpt2 --gpus 4 --tp 5
run bad-seq estimate --model gpt2 --seq 99999
run bad-model estimate --model nosuch
run models models
run models-json models --json
echo "$n commands" >&2
