#!/usr/bin/python3
"""Writes memo-put-over-record.pickle: a snapshot whose pickle stores a value over the memo
index of a trace entry read already, then numbers later MEMOIZEs after it. Python's
unpickler counts an index once however often it is stored (memo_len), so the next MEMOIZE
after the overwrite gets the index one past the last; a reader that let a record's index
count as empty again would number every later value one too far and read entry 4's key
wrong. Entry 1 holds a float, so it is read opcode by opcode, not by the entries' fast path.

    /usr/bin/python3 tests/data/good/make_memo_pickles.py
"""
import os
import pickle
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
M = b'\x94'  # MEMOIZE


def text(t):
    b = t.encode()
    return b'\x8c' + bytes([len(b)]) + b


def get(i):
    return b'h' + bytes([i])


def put(i):
    return b'q' + bytes([i])


def long1(v):
    b = v.to_bytes((v.bit_length() + 8) // 8, 'little', signed=True)
    return b'\x8a' + bytes([len(b)]) + b


def int4(v):
    return b'J' + struct.pack('<i', v)


A = 0x7f0000000000
o = b'\x80\x04' + b'}' + M + b'('                        # 0: the snapshot
o += text('segments') + M + b']' + M                      # 1, 2
o += text('device_traces') + M + b']' + M + b'('          # 3, 4
o += b']' + M + b'('                                      # 5: device 0's entries
# entry 1 (6): action 7, alloc 8, addr 9, size 10, stream 11, x 12 -> memo length 13
o += (b'}' + M + b'(' + text('action') + M + text('alloc') + M + text('addr') + M + long1(A) +
      text('size') + M + int4(512) + text('stream') + M + b'K\x00' + text('x') + M + b'G' +
      struct.pack('>d', 1.5) + b'u')
# entry 2 (13): its action a new string stored over entry 1's index 6 (the length stays 13)
o += (b'}' + M + b'(' + get(7) + text('free_requested') + put(6) + get(9) + long1(A) +
      get(10) + int4(512) + get(11) + b'K\x00' + b'u')
# entry 3 (14): a new key string at the next index, 15
o += (b'}' + M + b'(' + get(7) + get(8) + text('addr') + M + long1(A + 512) + get(10) +
      int4(1024) + get(11) + b'K\x00' + b'u')
# entry 4: index 15 as its 'addr' key, index 6 as its action
o += (b'}' + M + b'(' + get(7) + get(6) + get(15) + long1(A + 512) + get(10) + int4(1024) +
      get(11) + b'K\x00' + b'u')
o += b'e' + b'e' + b'u' + b'.'

entries = pickle.loads(o)['device_traces'][0]
assert [e['action'] for e in entries] == ['alloc', 'free_requested'] * 2, entries
assert entries[3]['addr'] == A + 512, entries
with open(os.path.join(HERE, 'memo-put-over-record.pickle'), 'wb') as f:
    f.write(o)
