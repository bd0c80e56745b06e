#!/usr/bin/python3
"""Writes the bad pickle inputs of this folder (each must make `memsim` exit with status 2).

Run from anywhere with the system Python (torch is never imported):

    /usr/bin/python3 tests/data/bad/make_bad_pickles.py

`pickle-*` files are malformed or malicious pickles that the restricted reader
(formats/pickle.c) must refuse. `snapshot-*` files are valid pickles of plain data whose
content breaks the snapshot schema; the snapshot importer must refuse them. All start from
the same small snapshot, shaped like torch.cuda.memory._snapshot() of PyTorch 2.x: keys
segments, device_traces, allocator_settings, external_annotations; trace entries have
action/addr/size/stream/time_us/frames.
"""
import collections
import copy
import io
import os
import pickle
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

FRAMES = [
    {'name': 'torch::unwind::unwind()', 'filename': '??', 'line': 0},
    {'name': 'forward', 'filename': '/home/user/model.py', 'line': 42},
]
SEG_ADDR = 139777059848192
SNAPSHOT = {
    'segments': [{
        'device': 0,
        'address': SEG_ADDR,
        'total_size': 2097152,
        'allocated_size': 1024,
        'active_size': 1024,
        'requested_size': 1000,
        'stream': 0,
        'segment_type': 'small',
        'segment_pool_id': (0, 0),
        'is_expandable': False,
        'blocks': [
            {'address': SEG_ADDR, 'size': 1024, 'requested_size': 1000,
             'state': 'active_allocated', 'frames': FRAMES},
            {'address': SEG_ADDR + 1024, 'size': 2096128, 'requested_size': 0,
             'state': 'inactive', 'frames': []},
        ],
        'frames': [],
    }],
    'device_traces': [[
        {'action': 'segment_alloc', 'addr': SEG_ADDR, 'size': 2097152, 'stream': 0,
         'time_us': 1772688692031317, 'frames': FRAMES},
        {'action': 'alloc', 'addr': SEG_ADDR, 'size': 1024, 'stream': 0,
         'time_us': 1772688692031320, 'frames': FRAMES},
        {'action': 'alloc', 'addr': SEG_ADDR + 1024, 'size': 512, 'stream': 0,
         'time_us': 1772688692031400, 'frames': FRAMES},
        {'action': 'free_requested', 'addr': SEG_ADDR + 1024, 'size': 512, 'stream': 0,
         'time_us': 1772688692031500, 'frames': FRAMES},
        {'action': 'free_completed', 'addr': SEG_ADDR + 1024, 'size': 512, 'stream': 0,
         'time_us': 1772688692031501, 'frames': FRAMES},
    ]],
    'allocator_settings': {
        'PYTORCH_CUDA_ALLOC_CONF': '',
        'max_split_size': -1,
        'garbage_collection_threshold': 0.0,
        'expandable_segments': False,
        'pinned_num_register_threads': 1,
        'release_lock_on_cudamalloc': False,
        'pinned_use_cuda_host_register': False,
        'roundup_power2_divisions': {str(1 << i): 0 for i in range(16)},
    },
    'external_annotations': [],
}


def snapshot(**changes):
    s = copy.deepcopy(SNAPSHOT)
    s.update(changes)
    return s


def dumps(obj, protocol=4):
    return pickle.dumps(obj, protocol=protocol)


def replace_once(data, old, new):
    assert data.count(old) >= 1, old
    return data.replace(old, new, 1)


def bad_files():
    good = dumps(SNAPSHOT)
    # Hand edits that change lengths start from protocol 2: it has no FRAME lengths to fix.
    good2 = dumps(SNAPSHOT, protocol=2)
    out = {}

    # A global and a call: protocol 2 pickles an OrderedDict as GLOBAL + REDUCE.
    out['pickle-global'] = dumps(snapshot(extra=collections.OrderedDict(a=1)), protocol=2)
    # Protocol 4 names globals with STACK_GLOBAL.
    out['pickle-stack-global'] = dumps(snapshot(extra=collections.OrderedDict(a=1)))
    # REDUCE without any global before it: "call" None with ().
    out['pickle-reduce'] = replace_once(dumps(snapshot(extra='REDUCE-HERE'), protocol=2),
                                        b'X\x0b\x00\x00\x00REDUCE-HERE', b'N)R')
    # BUILD: "set the state" of the last empty dict with another empty dict.
    i = good2.rindex(b'}')
    out['pickle-build'] = good2[:i + 1] + b'}b' + good2[i + 1:]
    # A file cut in the middle (protocol 4, as snapshots are: its FRAME claims more bytes
    # than remain).
    out['pickle-truncated'] = good[:len(good) // 2]
    # An opcode byte that no pickle protocol defines, in place of the first EMPTY_LIST.
    i = good.index(b']')
    out['pickle-corrupt-opcode'] = good[:i] + b'\xff' + good[i + 1:]
    # A BINGET of a memo entry that was never stored.
    i = good.index(b'h')  # the first BINGET
    out['pickle-bad-memo'] = good[:i + 1] + b'\xfe' + good[i + 2:]
    # The segments list contains itself: right after the list is made and memoized (as
    # entry 2), a BINGET of it is appended to it.
    out['pickle-cycle'] = replace_once(good2, b'segmentsq\x01]q\x02',
                                       b'segmentsq\x01]q\x02h\x02a')
    # A BINUNICODE that claims 4 GiB - 16 bytes in a file of a few KiB.
    out['pickle-huge-length'] = replace_once(
        dumps(snapshot(extra='HUGE'), protocol=2), b'X\x04\x00\x00\x00HUGE',
        b'X' + struct.pack('<I', 0xfffffff0) + b'HUGE')

    # Valid pickles, invalid snapshots.
    s = snapshot()
    s['device_traces'][0][1]['size'] = '1024'
    out['snapshot-size-is-str'] = dumps(s)
    s = snapshot()
    s['device_traces'][0][1]['size'] = 2**64 - 1  # LONG1 of 9 bytes: beyond int64
    out['snapshot-size-2pow64'] = dumps(s)
    out['snapshot-segments-not-list'] = dumps(snapshot(segments={'0': SNAPSHOT['segments'][0]}))
    s = snapshot()
    s['device_traces'][0][1]['size'] = -512
    out['snapshot-negative-size'] = dumps(s)
    # 4097 devices: a few KiB that would make 4097 ranks, each costing the replay tens of KiB.
    out['snapshot-too-many-devices'] = dumps(snapshot(
        segments=[], device_traces=[[{'action': 'snapshot'}] for _ in range(4097)]))
    # Records held more than once through the memo: PyTorch makes each record a new object,
    # and 2 bytes of BINGET per copy would let a small file stand for millions of records.
    entry = {'action': 'snapshot'}
    out['snapshot-shared-entry'] = dumps(snapshot(device_traces=[[entry] * 3]))
    s = snapshot()
    s['device_traces'].append(s['device_traces'][0])
    out['snapshot-shared-device-trace'] = dumps(s)
    s = snapshot()
    s['segments'].append(s['segments'][0])
    out['snapshot-shared-segment'] = dumps(s)
    s = snapshot()
    s['segments'][0]['blocks'][1] = s['segments'][0]['blocks'][0]
    out['snapshot-shared-block'] = dumps(s)

    # Declared lengths far beyond the file: refused before anything is allocated for them.
    def huge(opcode, length_bytes):
        data = dumps(snapshot(extra='HUGE'), protocol=2)
        return replace_once(data, b'X\x04\x00\x00\x00HUGE', opcode + length_bytes + b'HUGE')
    out['pickle-binunicode8-huge'] = huge(b'\x8d', struct.pack('<Q', 1 << 62))
    out['pickle-binbytes8-huge'] = huge(b'\x8e', struct.pack('<Q', 0xffffffffffffffff))
    out['pickle-long4-huge'] = huge(b'\x8b', struct.pack('<I', 0x7ffffff0))
    # A FRAME claiming 2^60 bytes.
    good4 = dumps(SNAPSHOT)
    assert good4[2:3] == b'\x95'
    out['pickle-frame-huge'] = good4[:3] + struct.pack('<Q', 1 << 60) + good4[11:]
    return out


def inconsistent_files():
    """Snapshots that contradict themselves or hold what memsim does not know: read with one
    warning line per kind (naming the file), exit 0; under --verify each is a mismatch."""
    out = {}
    s = snapshot()
    for k in range(3):  # three entries of one unknown action, one of another
        s['device_traces'][0].insert(1, {'action': 'frobnicate', 'addr': 0, 'size': 0,
                                         'stream': 0, 'time_us': 1, 'frames': []})
    s['device_traces'][0].insert(1, {'action': 'alloc_v2', 'addr': 0, 'size': 0, 'stream': 0,
                                     'time_us': 1, 'frames': []})
    s['device_traces'][0].insert(1, {'action': 'user_defined', 'addr': 0, 'size': 0,
                                     'stream': 0, 'time_us': 1, 'frames': []})
    out['inconsistent-unknown-actions'] = dumps(s)
    s = snapshot()
    # a free of an address no segment holds (far below the only segment)
    s['device_traces'][0].append({'action': 'free_requested', 'addr': 4096, 'size': 512,
                                  'stream': 0, 'time_us': 2, 'frames': []})
    out['inconsistent-free-unknown-address'] = dumps(s)
    s = snapshot()
    s['segments'][0]['blocks'][0]['state'] = 'active_awaiting_godot'
    out['inconsistent-block-state'] = dumps(s)
    s = snapshot()
    s['segments'][0]['allocated_size'] = 2097152 * 2
    out['inconsistent-allocated-size'] = dumps(s)
    return out


# Python's own unpickler (with globals refused) accepts these; memsim must still refuse them.
PYTHON_LOADS = {'pickle-cycle'}


class Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError('global %s.%s refused' % (module, name))


def main():
    for name, data in sorted(bad_files().items()):
        # Sanity: the snapshot-level files are loadable plain data, the others are not.
        try:
            Restricted(io.BytesIO(data)).load()
            loads = True
        except Exception:
            loads = False
        assert loads == (name.startswith('snapshot-') or name in PYTHON_LOADS), name
        path = os.path.join(HERE, name + '.exit2.pickle')
        with open(path, 'wb') as f:
            f.write(data)
        print('%-40s %6d bytes' % (os.path.basename(path), len(data)))
    for name, data in sorted(inconsistent_files().items()):
        Restricted(io.BytesIO(data)).load()
        path = os.path.join(HERE, name + '.exit0.pickle')
        with open(path, 'wb') as f:
            f.write(data)
        print('%-40s %6d bytes' % (os.path.basename(path), len(data)))


if __name__ == '__main__':
    main()
