# bash completion for memsim (installed as share/bash-completion/completions/memsim).
#
# Subcommands and their flags are read from the command itself (`memsim --help`,
# `memsim CMD --help-all`) the first time they are needed, so they follow the installed
# version; model presets come from `memsim models`, allocator policies from
# `memsim replay --allocator help`. Trace and config paths complete as files.

_memsim_query()
{
    # $1: the memsim binary; the rest: its arguments. Empty output when it fails.
    "$@" 2>/dev/null
}

_memsim_commands()
{
    _memsim_query "$1" --help | sed -n 's/^  \([a-z][a-z-]*\)  .*/\1/p'
}

_memsim_flags()
{
    # Option lines of --help-all: "  -o, --output=FILE   ..." or "  --json   ...".
    _memsim_query "$1" "$2" --help-all |
        sed -n 's/^  \(-[a-zA-Z], \)\{0,1\}\(--[a-z0-9-]*\)\(=[^ ]*\)\{0,1\} .*/\2\3/p' |
        sed 's/=.*/=/'
}

_memsim_values()
{
    # $1: binary, $2: subcommand, $3: option name (with --). Prints the choices, or
    # "__file__" when the value is a path.
    case $3 in
    --model)
        _memsim_query "$1" models | awk '{print $1}'
        echo __file__ ;;
    --precision) echo fp32 bf16-mixed fp16-mixed bf16 fp16 ;;
    --optimizer) echo adamw sgd sgd-momentum adafactor adamw-8bit ;;
    --optimizer-impl) echo default for-loop foreach fused ;;
    --zero-grad) echo none zero ;;
    --attention) echo sdpa eager sdpa-math flash mem-efficient ;;
    --checkpointing) echo none full selective sac-op sac-layer ;;
    --sac-ops) echo mm addmm bmm sdpa topk ;;
    --finetune) echo full lora qlora ;;
    --weights) echo default int8 4bit ;;
    --device) echo cuda cpu ;;
    --method) echo none ddp zero1 zero2 zero3 fsdp fsdp-grad-op hsdp megatron ;;
    --pp-schedule | --schedules) echo 1f1b gpipe interleaved ;;
    --methods) echo ddp zero1 zero2 zero3 zero fsdp fsdp-grad-op hsdp tp pp megatron all ;;
    --checkpointing-modes) echo none selective full ;;
    --fsdp-wrap) echo layer model lora size ;;
    --fsdp-version) echo 1 2 ;;
    --fsdp-sharding) echo full grad-op hybrid no-shard ;;
    --fsdp-param-dtype | --fsdp-reduce-dtype | --fsdp-output-dtype) echo fp32 bf16 fp16 ;;
    --fsdp-backward-prefetch) echo pre post none ;;
    --fsdp-offload | --fsdp-limit-all-gathers | --fsdp-use-orig-params | --fsdp-reshard-after-forward) echo true false ;;
    --gpu) echo a100-40gb a100-80gb h100-80gb h200 v100-16gb v100-32gb a10g l4 rtx4090 rtx3090 ;;
    --sequence-parallel | --inference) echo true false ;;
    --torch-version) echo 1.13 2.0 2.1 2.2 2.3 2.4 2.5 2.6 2.7 2.8 2.9 ;;
    --transformers-version) echo 4.35 4.36 4.37 4.38 4.39 4.41 4.42 4.45 4.46 4.57 5.0 ;;
    --use-cache | --keep-outputs | --zero-redundancy) echo true false ;;
    --allocator | --allocators)
        _memsim_query "$1" replay --allocator help | awk '/^[a-z]/ {print $1}'
        if [ "$3" = --allocator ]; then echo help; else echo all; fi ;;
    --alloc-conf)
        echo expandable_segments:True max_split_size_mb: roundup_power2_divisions: \
            garbage_collection_threshold: ;;
    -o | --output | --run | --megatron-args | --deepspeed-config) echo __file__ ;;
    --frames-skip) echo /lib/ /venv/ /opt/ ;;
    --gpu-mem) echo 16GiB 24GiB 40GiB 48GiB 80GiB 141GiB a100-40gb a100-80gb h100-80gb h200 \
        v100-16gb v100-32gb a10g l4 rtx4090 rtx3090 ;;
    *)
        # Any other option whose argument is a FILE (or a TRACE) takes a path.
        case $(_memsim_query "$1" "$2" --help-all |
            sed -n "s/^ *\(-[a-zA-Z], \)\{0,1\}$3=\([A-Z]*\) .*/\2/p") in
        FILE | TRACE) echo __file__ ;;
        *) echo __none__ ;;
        esac ;;
    esac
}

_memsim()
{
    local cur=${COMP_WORDS[COMP_CWORD]} prev= bin=${COMP_WORDS[0]} cmd= i opt
    [ "$COMP_CWORD" -gt 0 ] && prev=${COMP_WORDS[COMP_CWORD - 1]}
    COMPREPLY=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
        -*) ;;
        *) cmd=${COMP_WORDS[i]}; break ;;
        esac
    done
    if [ -z "$cmd" ]; then
        COMPREPLY=($(compgen -W "$(_memsim_commands "$bin") --help --version" -- "$cur"))
        return
    fi

    # The option whose value is being completed: "--opt VALUE", "--opt=VALUE" (split at
    # '=' by bash's COMP_WORDBREAKS, or not).
    opt=
    if [ "$cur" = "=" ]; then
        opt=$prev cur=
    elif [ "$prev" = "=" ] && [ "$COMP_CWORD" -ge 2 ]; then
        opt=${COMP_WORDS[COMP_CWORD - 2]}
    elif [[ $cur == --*=* ]]; then
        opt=${cur%%=*} cur=${cur#*=}
    elif [[ $prev == -* ]] && [[ $prev != *=* ]] &&
        _memsim_flags "$bin" "$cmd" | grep -qx -- "$prev="; then
        opt=$prev
    elif [ "$prev" = "-o" ]; then
        opt=-o
    fi
    if [ -n "$opt" ]; then
        local values
        # one line, space-separated (the presets come one per line)
        values=$(_memsim_values "$bin" "$cmd" "$opt" | tr '\n' ' ')
        case " $values " in
        *" __file__ "*)
            COMPREPLY=($(compgen -W "${values//__file__/}" -- "$cur") $(compgen -f -- "$cur")) ;;
        *" __none__ "*) ;;
        *)
            if [[ $opt == --@(allocators|methods|schedules|checkpointing-modes) ]] &&
                [[ $cur == *,* ]]; then
                # A comma-separated list: complete its last element.
                COMPREPLY=($(compgen -P "${cur%,*}," -W "$values" -- "${cur##*,}"))
            else
                COMPREPLY=($(compgen -W "$values" -- "$cur"))
            fi ;;
        esac
        return
    fi

    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_memsim_flags "$bin" "$cmd")" -- "$cur"))
        # "--flag=" takes its value right after the '='.
        [ "${#COMPREPLY[@]}" -eq 1 ] && [[ ${COMPREPLY[0]} == *= ]] && compopt -o nospace 2>/dev/null
        return
    fi
    # Positional arguments: trace files (replay, convert, compare, ...).
    COMPREPLY=($(compgen -f -- "$cur"))
    compopt -o filenames 2>/dev/null
}

complete -F _memsim memsim
