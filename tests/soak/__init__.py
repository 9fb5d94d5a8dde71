"""The chaos soak: a real sidecar under steady Kafka-like load while things go
wrong around it, for a bounded time (`make soak`; `python -m tests.soak
--minutes 2 --seed 7`; root, for the loop device).

Set-up, all on 127.0.0.1: moto (the object store), tests/support/fault_proxy.py
in front of it, and `sidecar serve` in front of that, with its cache (1 MiB
blocks, 64 slots, a sparse slab) on an ext4 file system of its own on a loop
device, small enough that it can be filled.

Load, all at once until the time is up: replay readers (a broker's remote
reader: `bytes=pos-`, about 1 MiB taken, the connection dropped, on through a
partition's segments), random range readers (segments and two objects that the
origin keeps rewriting, alternating between two known versions), and a writer
that PUTs and DELETEs its own scratch keys through the sidecar, signed with
boto3, and reads each back.

Chaos (tests/soak/schedule.py, from `--seed`): an event every few seconds:
kill -9 and a restart on the same cache dir; origin faults (resets before and
in the body, stalls, 503 bursts, SlowDown, truncated bodies, the whole origin
down); ETag flips (an object rewritten at the origin between the sidecar's HEAD
and its GET); warm calls; mode flips and back to normal; the disk filled up
and freed; slab.dat truncated; holes punched into slots. The last sixth of the
run (at most a minute): the loop device's backing file cut short, so that cache
reads fail with EIO, with the reads going on.

Judging (tests/soak/judge.py): every byte of every 200/206 answer is compared
with the truth; an answer of an object that may have two versions must be the
same range of one of them, never a mix. Errors (503, resets, refused
connections while the sidecar restarts, ...) are counted by kind, not failures;
a body cut short is "cut" and its prefix compared all the same. The sidecar's
RSS and open fds are sampled every second (psutil).

The run fails (exit 1) when a wrong byte was served (or a 404 for an object
that exists), the sidecar exited without being killed by the soak (or not
cleanly at the final SIGTERM), or its RSS or fds grew without bound. The growth
rule: after a warm-up of a sixth of the run (at most a minute), the peak of the
first window must bound the peak of the last window, each a quarter of the run
(at most 5 minutes): last <= 1.25 x first + 32 MiB for RSS, 1.5 x first + 16
for fds (their count follows the connections open at the moment). A
summary goes to test-artifacts/reliability/soak.json (and stdout), the
sidecar's stderr to soak-sidecar.log beside it.
"""
