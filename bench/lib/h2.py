"""A raw HTTP/2 client for the abuse tests and the soak: what grpcio will not do on
purpose (reset a call halfway through its message, hold a connection without
a preface, read the server's SETTINGS). Debian ships no Python h2 package, so
the few frames needed are written by hand (RFC 9113; HPACK literals only,
RFC 7541 section 6.2.2)."""

import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
CANCEL = 0x8


def _hpack_int(value, prefix_bits, first_byte=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte | value])
    out = bytearray([first_byte | limit])
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _literal(name, value):
    """A literal header field without indexing, new name, no Huffman."""
    name, value = name.encode(), value.encode()
    return (b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value)


def frame(kind, flags, stream_id, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream_id & 0x7FFFFFFF) + payload


def closed_by_peer(sock, timeout=0.0):
    """True once the peer closed the socket (EOF or reset) within `timeout`
    seconds (0: as of now); what it sent before (SETTINGS, GOAWAY) is read
    and dropped."""
    previous = sock.gettimeout()
    if timeout:
        sock.settimeout(timeout)
    else:
        sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (BlockingIOError, socket.timeout):
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(previous)


class Connection:
    """One HTTP/2 connection to a gRPC server on loopback."""

    def __init__(self, address, timeout=5.0, preface=True):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buffer = b""
        if preface:
            self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))

    def close(self):
        self.sock.close()

    def closed_by_peer(self, timeout=0.0):
        """closed_by_peer(self.sock, timeout)."""
        return closed_by_peer(self.sock, timeout)

    def headers(self, stream_id, path, authority="localhost", extra=(), end_stream=False):
        block = b"".join(_literal(n, v) for n, v in (
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", authority), ("content-type", "application/grpc"),
            ("te", "trailers"), *extra))
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        self.sock.sendall(frame(HEADERS, flags, stream_id, block))

    def data(self, stream_id, payload, end_stream=False):
        self.sock.sendall(frame(DATA, END_STREAM if end_stream else 0, stream_id, payload))

    def reset_unary_calls_halfway(self, path, stream_ids=(1, 3, 5)):
        """A unary call to `path` on each of `stream_ids` whose gRPC prefix
        announces 1,000 bytes: 10 arrive, then the call is reset (CANCEL)."""
        for stream_id in stream_ids:
            self.headers(stream_id, path)
            self.data(stream_id, grpc_message(b"\x0a" * 10, declared_length=1000))
            self.reset(stream_id)

    def reset(self, stream_id, code=CANCEL):
        self.sock.sendall(frame(RST_STREAM, 0, stream_id, struct.pack(">I", code)))

    def ping(self, opaque=b"softmax!"):
        """Sends a PING and reads frames up to its ACK: once it returns, the
        server has read every frame sent before the PING."""
        self.sock.sendall(frame(PING, 0, 0, opaque))
        while True:
            kind, flags, _, payload = self.read_frame()
            if kind == PING and flags & ACK and payload == opaque:
                return

    def read_frame(self):
        """(type, flags, stream id, payload); raises ConnectionError on EOF."""
        while len(self.buffer) < 9:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed by the server")
            self.buffer += chunk
        length = int.from_bytes(self.buffer[:3], "big")
        while len(self.buffer) < 9 + length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed by the server")
            self.buffer += chunk
        kind, flags = self.buffer[3], self.buffer[4]
        stream_id = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
        payload = self.buffer[9:9 + length]
        self.buffer = self.buffer[9 + length:]
        return kind, flags, stream_id, payload

    def server_settings(self):
        """The settings of the server's first (non-ACK) SETTINGS frame."""
        while True:
            kind, flags, _, payload = self.read_frame()
            if kind == SETTINGS and not flags & ACK:
                return {struct.unpack(">H", payload[i:i + 2])[0]:
                        struct.unpack(">I", payload[i + 2:i + 6])[0]
                        for i in range(0, len(payload), 6)}


def grpc_message(body, declared_length=None):
    """A gRPC length-prefixed message (uncompressed); `declared_length` may
    claim more bytes than `body` has."""
    length = len(body) if declared_length is None else declared_length
    return b"\x00" + struct.pack(">I", length) + body
