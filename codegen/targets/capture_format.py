"""The capture container, shared by the Python `capture` module and `pgoutput_capture.ksy`.

File: MAGIC, u1 FORMAT_VERSION, then records to the end of the file, each
u1 protocol_version, u1 flags, u8 lsn, u4 length, then `length` bytes of one pgoutput
message. Big-endian throughout.
"""

MAGIC = b"PGOUTCAP"
FORMAT_VERSION = 1
FLAG_IN_STREAM = 0x01
FLAG_PARALLEL_STREAMING = 0x02
RECORD_HEADER = ">BBQI"  # protocol_version, flags, lsn, length
