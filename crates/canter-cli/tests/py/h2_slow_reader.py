"""A slow HTTP/2 reader: `python3 h2_slow_reader.py PORT SIZE RATE SITE_PACKAGES` fetches
/bytes/SIZE over h2c (prior knowledge) with windows large enough for the whole body, through a
4 KiB receive buffer at RATE bytes/s, and prints "body N" with the body bytes that arrived and
"ended" if the stream ended."""

import socket
import sys
import time

port, size, rate = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, sys.argv[4])

import h2.config  # noqa: E402
import h2.connection  # noqa: E402
import h2.events  # noqa: E402
import h2.settings  # noqa: E402

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.settimeout(30)
s.connect(("127.0.0.1", port))
conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
conn.local_settings = h2.settings.Settings(
    client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
conn.initiate_connection()
conn.increment_flow_control_window(2**31 - 1 - 65535)
sid = conn.get_next_available_stream_id()
conn.send_headers(sid, [(":method", "GET"), (":path", f"/bytes/{size}"),
                        (":scheme", "http"), (":authority", "x")], end_stream=True)
s.sendall(conn.data_to_send())
start = time.monotonic()
got, read, ended = 0, 0, False
while not ended:
    try:
        data = s.recv(65536)
    except (ConnectionResetError, socket.timeout):
        break
    if not data:
        break
    read += len(data)
    for event in conn.receive_data(data):
        if isinstance(event, h2.events.DataReceived) and event.stream_id == sid:
            got += len(event.data)
        elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
            ended = True
        elif isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
            ended = None
    out = conn.data_to_send()
    if out:
        s.sendall(out)
    ahead = read / rate - (time.monotonic() - start)
    if ahead > 0:
        time.sleep(ahead)
    if ended is None:
        break
print("body", got, flush=True)
if ended:
    print("ended", flush=True)
