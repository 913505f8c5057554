"""What one more subscriber costs a publisher: a libzmq PUB (pyzmq, the library vLLM publishes
KV events with) sends batch-sized messages to 1, 2, 3... draining SUB processes on loopback, and
we report the publisher process's CPU (user + system, its libzmq I/O thread included) per
message and the rate it reached.

Two runs per subscriber count:
- `fixed`: a paced rate (default 2,000 batches/s, well above what one engine emits), CPU % of
  one core spent by the publisher;
- `max`: as fast as the PUB takes them for `secs` seconds (HWM raised so that nothing is dropped
  at the socket), rate and CPU per message.

The subscribers only drain: a PUB sees no difference between a SUB that indexes a batch and one
that drops it, as long as it keeps up (it sees TCP). Run:

    .venv/bin/python benches/fanout.py [--subs 1,2,3] [--secs 5] [--rate 2000] [--size 2048]
"""

import argparse
import multiprocessing as mp
import os
import resource
import time

import zmq


def drain(endpoint: str, ready, stop, counts, index: int) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    ready.release()
    n = 0
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    while not stop.is_set():
        if poller.poll(100):
            while True:
                try:
                    sub.recv_multipart(zmq.NOBLOCK)
                    n += 1
                except zmq.Again:
                    break
    counts[index] = n
    sub.close(0)
    ctx.term()


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(subs: int, secs: float, rate: float, size: int) -> dict:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    ready, stop = mp.Semaphore(0), mp.Event()
    counts = mp.Array("q", subs)
    procs = [
        mp.Process(target=drain, args=(endpoint, ready, stop, counts, i)) for i in range(subs)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    # Slow joiner: send until every subscriber got something, then start counting.
    time.sleep(0.5)
    payload = os.urandom(size)
    topic = b""
    seq = 0
    out = {}
    for mode in ("fixed", "max"):
        sent = 0
        t0, c0 = time.perf_counter(), cpu()
        deadline = t0 + secs
        # Paced in 10 ms ticks (as an engine publishes a batch per scheduler step), so that the
        # pacing itself costs little next to the sends.
        per_tick = max(1, round(rate / 100))
        next_at = t0
        while True:
            now = time.perf_counter()
            if now >= deadline:
                break
            if mode == "fixed":
                if now < next_at:
                    time.sleep(next_at - now)
                    continue
                next_at += 0.01
                burst = per_tick
            else:
                burst = 64
            for _ in range(burst):
                seq += 1
                pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
            sent += burst
        wall, used = time.perf_counter() - t0, cpu() - c0
        out[mode] = {
            "sent": sent,
            "rate": sent / wall,
            "cpu_pct": 100.0 * used / wall,
            "cpu_us_per_msg": 1e6 * used / max(sent, 1),
        }
    time.sleep(1.0)
    stop.set()
    for p in procs:
        p.join(10)
    out["received_min"] = min(counts[:]) if subs else 0
    out["sent_total"] = out["fixed"]["sent"] + out["max"]["sent"]
    pub.close(0)
    ctx.term()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--subs", default="1,2,3")
    ap.add_argument("--secs", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--size", type=int, default=2048)
    args = ap.parse_args()
    print(
        f"payload {args.size} B, fixed rate {args.rate:.0f}/s, {args.secs:.0f} s per run, "
        f"{os.cpu_count()} cores"
    )
    print("subs | fixed: cpu % | us/msg | max: msgs/s | cpu % | us/msg | sent | least received")
    for n in [int(s) for s in args.subs.split(",")]:
        r = run(n, args.secs, args.rate, args.size)
        f, m = r["fixed"], r["max"]
        print(
            f"{n:4} | {f['cpu_pct']:12.1f} | {f['cpu_us_per_msg']:6.1f} | {m['rate']:11.0f} | "
            f"{m['cpu_pct']:5.1f} | {m['cpu_us_per_msg']:6.1f} | {r['sent_total']} | {r['received_min']}"
        )


if __name__ == "__main__":
    main()
