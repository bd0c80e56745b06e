#!/bin/sh
# Derives tests/data/snapshots/ from the real PyTorch memory snapshots in
# ../shared/data/torch-snapshots/ (see its README): for each snapshot that carries a trace,
# the allocator's facts only — every alloc and free with its size, stream and recorded
# address, every segment_alloc/free/map/unmap, empty_cache, the recorded OOM (its rounded
# request and the device's free bytes) and the device's capacity it implies, the segments
# and blocks live before the trace, the allocator settings and the final reserved and
# allocated bytes — as a memsim .mst trace
# (zstd). No Python frame, file name or path of the source is kept: the trace's name is
# set to the source repository, path and commit.
#
# Usage: tools/snapshot-fixture.sh MEMSIM SRC_DIR OUT_DIR
#   e.g. tools/snapshot-fixture.sh build/tools/memsim ../shared/data/torch-snapshots tests/data/snapshots
set -eu
memsim=$1
src=$2
out=$3
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# file here | source repository | path in the repository | commit
while IFS='|' read -r file repo path commit; do
    [ -n "$file" ] || continue
    base=${file%.pickle}
    base=${base%.pkl}
    base=${base%.json}
    "$memsim" convert "$src/$file" "$tmp/s.txt"
    # Only the allocator's facts: the allocs' Python stacks (strings 1.., named by each
    # alloc's aux=) go; the name becomes the provenance; a string table beyond the
    # importer's one mark name, or any op, would be something of the source's own.
    grep -v '^string [1-9]' "$tmp/s.txt" | sed 's/^\(alloc .*\) aux=[0-9a-fx]*/\1/' >"$tmp/t.txt"
    if grep -E '^(op |string [1-9])|aux=' "$tmp/t.txt" >/dev/null; then
        echo "$file: holds strings or ops beyond the allocator's facts" >&2
        exit 1
    fi
    sed "s|^name .*|name \"$repo $path @ $commit (allocator events)\"|" "$tmp/t.txt" >"$tmp/u.txt"
    "$memsim" convert "$tmp/u.txt" "$out/$base.mst"
done <<'LIST'
Constructor-Sun__code_location__memory_snapshot.pickle|Constructor-Sun/code_location|memory_snapshot.pickle|52e52b22f10002e0a3de5015068774003bc5af92
JasperSolt__EoR_NN__snapshot.pickle|JasperSolt/EoR_NN|snapshot.pickle|6686e9f4bc5edcc86209915a0d5fe694b836b8b7
MAGMA27__assignment2-systems__memory_snapshot.pickle|MAGMA27/assignment2-systems|memory_snapshot.pickle|15883f2b1d6bc52439d8935e280bce430151f361
Maphsge4__select_n__snapshot@1f2f548.pickle|Maphsge4/select_n|snapshot.pickle|1f2f548046cdbb1962c54843a8149a88b930a5f1
MercuryB1__SQAttn__cuda_memory_snapshot.pickle|MercuryB1/SQAttn|cuda_memory_snapshot.pickle|126d2e6868a9d3d489599329d64b74de69d113b6
Nesta-gitU__discrete_diffusion__memory_snapshot.json.pickle|Nesta-gitU/discrete_diffusion|memory_snapshot.json|657e3e3a2c8fef36e68602413d4d2288d2ad3bb7
Wedsonlin__assignment2-systems__results_medium_128_inference_memory_snapshot.pickle|Wedsonlin/assignment2-systems|results/medium_128_inference_memory_snapshot.pickle|8630bcfe2d6f1c1f4b30a13bd611319d0329ec74
Wedsonlin__assignment2-systems__results_medium_128_training_memory_snapshot.pickle|Wedsonlin/assignment2-systems|results/medium_128_training_memory_snapshot.pickle|8630bcfe2d6f1c1f4b30a13bd611319d0329ec74
bcrafton__assignment2-systems__memory_snapshot.pickle|bcrafton/assignment2-systems|memory_snapshot.pickle|0c0e8a736edbf5f55ec1a3536fd0f126a9eb9ee9
cranberrii__ftcourse__memory_snapshot.pickle|cranberrii/ftcourse|memory_snapshot.pickle|9f4902cf9569067d94adf4d467cc59582e98ff85
kkaitlyn111__cs336-a2-systems__memory_ctx128_forward.pickle|kkaitlyn111/cs336-a2-systems|memory_ctx128_forward.pickle|46eae3f8496b991414c11b2c27950863ff4d5423
kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle|kkaitlyn111/cs336-a2-systems|memory_ctx128_fullstep.pickle|46eae3f8496b991414c11b2c27950863ff4d5423
kkaitlyn111__cs336-a2-systems__memory_files_memory_ctx128_forward_mixed.pickle|kkaitlyn111/cs336-a2-systems|memory_files/memory_ctx128_forward_mixed.pickle|46eae3f8496b991414c11b2c27950863ff4d5423
kkaitlyn111__cs336-a2-systems__memory_files_memory_ctx512_fullstep_.pickle|kkaitlyn111/cs336-a2-systems|memory_files/memory_ctx512_fullstep_.pickle|46eae3f8496b991414c11b2c27950863ff4d5423
kkaitlyn111__cs336-a2-systems__memory_small_forward.pickle|kkaitlyn111/cs336-a2-systems|memory_small_forward.pickle|46eae3f8496b991414c11b2c27950863ff4d5423
notHanmin__assignment2-systems__memory_snapshot_forward.pickle|notHanmin/assignment2-systems|memory_snapshot_forward.pickle|bbd29721256d92c17fed399bf8458b50ca221046
shreyansh26__MLSys-Experiments__profile_grad.pkl|shreyansh26/MLSys-Experiments|model_memory_usage/profile_grad.pkl|16debf2b19256a564cd88a049402795fcc44c972
shreyansh26__MLSys-Experiments__profile_no_grad.pkl|shreyansh26/MLSys-Experiments|model_memory_usage/profile_no_grad.pkl|16debf2b19256a564cd88a049402795fcc44c972
silmont2000__assignment2-systems__mem_snapshot.pickle|silmont2000/assignment2-systems|mem_snapshot.pickle|133f0643dd71416aa44409daafcf97e11078f3b9
silmont2000__assignment2-systems__memory_forward_fp32_128.pickle|silmont2000/assignment2-systems|memory_forward_fp32_128.pickle|133f0643dd71416aa44409daafcf97e11078f3b9
LIST
