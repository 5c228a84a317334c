"""The zygote: the sandbox's event loop, driving hardened cell processes that a forker makes for it.

It runs inside bubblewrap (see `launch.py`) and talks to the pool over its stdin/stdout with `protocol`
frames. It is single-threaded on purpose. It never forks a cell itself: at start it forks the *forker*
(`forker.py`) before importing anything heavy; the forker preloads the libraries and forks every cell from
that warm image, so the zygote's own writes copy no shared pages and no fork holds up an answer.

Per worker slot it keeps one *spare*: a child forked ahead of time that has already entered its own session,
set its rlimits, dropped to the slot's uid and loaded Landlock and seccomp, and now blocks reading its job
pipe. A call therefore costs one pipe write plus the cell itself. The zygote reads the child's stdout and
stderr as they come (a byte cap stops a flood), enforces the wall deadline, and answers as soon as the child
reports done; then it kills the process group and asks the forker for the slot's next spare, which the forker
forks while the zygote goes on. seccomp denies setsid and setpgid, so a cell's descendants cannot leave its
process group and one killpg ends them all; a sweep of the cell uids for processes outside every live group
runs only every few seconds, as a safety net (and after each cell when seccomp is off).

This module owns the start-up (the forker, probe, the ready report) and the event loop: control frames, which
slot serves a call, when spares are asked for, deadlines, exits and sending answers. The pieces it drives:

    forker    the process that preloads, forks cells and reaps them, and the zygote's handle on it
    child     forking a cell process, and everything that runs inside one (hardening, jobs, probe)
    jobs      a call in flight and the answer frame it becomes
    streams   the selector over every pipe, non-blocking reads, the output cap
    sessions  chat-mode sessions: indices, idle eviction, TTL
    procs     cell processes by uid and killing them (also what the host uses to look for leftovers)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time

from . import container_disk, harden, procs, protocol
from .child import Child, Container, own_container, prepare_scratch
from .figures import Limits
from .forker import Exited, Forker, ForkerGone, Spawned
from .jobs import STATUS_MAX, Job, answer, refusal
from .sessions import Session, SessionTable
from .streams import Streams

STRAY_SWEEP_S = 5.0  # how often the uid sweep behind killpg runs
CONTROL_IN, CONTROL_OUT = 0, 1  # CONTROL_OUT blocks: an answer is written whole
# Below glibc's mmap threshold: a larger read buffer is mapped and unmapped again on every control message.
CONTROL_CHUNK = 64 * 1024
# Fields of a run request that the child needs; the rest (id, session, op) are the zygote's.
JOB_FIELDS = ("kind", "code", "history", "stdin", "response", "gold", "rule", "protocol", "timeout_s")


class Zygote:
    def __init__(self, cfg: dict, forker: Forker) -> None:
        self.cfg = cfg
        self.forker = forker
        self.slots = int(cfg["slots"])  # uids with a spare each: workers plus a few kept ready
        self.drop_uid = bool(cfg["drop_uid"])
        self.uid_base = int(cfg["uid_base"])
        self.max_output_bytes = int(cfg["max_output_bytes"])
        self.status_max = Limits.of_config(cfg["images"]).status_bytes()
        self.streams = Streams()
        self.control = protocol.FrameBuffer()
        self.spares: dict[int, Child | None] = {}
        self.spawning: dict[int, int] = {}  # forker tag -> slot whose next spare it is
        self.arrived: dict[int, Child] = {}  # children asked for by `spawn`, by tag, until it takes them
        self.busy: dict[int, Job] = {}  # slot -> job
        self.children: dict[int, Child] = {}  # pid -> child, until its exit is reported
        self.killed: set[int] = set()  # children sent SIGKILL and not reaped yet
        self.sessions = SessionTable(int(cfg["max_sessions"]), float(cfg["session_ttl_s"]))
        self.running = True
        # seccomp denies setsid/setpgid: nothing a cell starts can leave its process group, so killpg is complete.
        self.groups_sealed = bool(cfg["groups_sealed"])
        self.last_sweep = time.monotonic()
        self.container_caps = container_disk.Caps.of_config(cfg["container_caps"])
        self.next_disk_check = 0.0

    # ------------------------------------------------------------------------------------ set-up
    def slot_uid(self, slot: int) -> int | None:
        return self.uid_base + slot if self.drop_uid else None

    def session_uid(self, index: int) -> int | None:
        return self.uid_base + self.slots + index if self.drop_uid else None

    def spawn(self, uid: int | None, scratch: str, persistent: bool, cpu_s: int, container: Container | None = None) -> Child:
        """A child now: ask the forker and wait for it (handling whatever else the forker reports meanwhile)."""
        tag = self.forker.request(uid, scratch, persistent, cpu_s, container)
        while tag not in self.arrived:
            self.on_forker(self.forker.wait())
        return self.arrived.pop(tag)

    def spawn_spare(self, slot: int) -> None:
        """Ask for the slot's next spare; it lands in `spares` when the forker has forked it."""
        self.spares[slot] = None
        tag = self.forker.request(self.slot_uid(slot), f"{self.cfg['scratch_root']}/slot{slot}", False, int(self.cfg["cpu_s"]))
        self.spawning[tag] = slot

    def on_forker(self, messages: list[Spawned | Exited]) -> None:
        for message in messages:
            if isinstance(message, Exited):
                self.on_exit(message.pid, message.status)
                continue
            child = message.child
            self.children[child.pid] = child
            slot = self.spawning.pop(message.tag, None)
            if slot is None:
                self.arrived[message.tag] = child
            else:
                self.spares[slot] = child

    def probe(self) -> dict:
        """Run a probe job in a hardened child and describe the layers that are really in force."""
        child = self.spawn(self.slot_uid(0), f"{self.cfg['scratch_root']}/slot0", False, int(self.cfg["cpu_s"]))
        protocol.write_frame(child.job, {"kind": "probe", "cpu_s": 5})
        os.set_blocking(child.status, True)
        raw = b""
        while not raw.endswith(b"\n"):
            chunk = os.read(child.status, STATUS_MAX)
            if not chunk:
                break
            raw += chunk
        self.destroy(child)
        try:
            message = json.loads(raw or b"{}")
        except ValueError:
            message = {}
        if message.get("status") != "ok":
            return {"error": message.get("detail") or "probe child died before reporting"}
        report = message["value"]
        report["zygote_network"] = _network_check()
        report["landlock_abi_kernel"] = harden.landlock_abi()
        return report

    # ------------------------------------------------------------------------------------- loop
    def serve(self) -> None:
        os.set_blocking(CONTROL_IN, False)
        self.streams.add(CONTROL_IN, "control")
        self.streams.add(self.forker.fileno(), "forker")
        for slot in range(self.slots):
            self.spawn_spare(slot)
        try:
            self.loop()
        except ForkerGone as exc:
            print(f"no cell can start: {exc}", file=sys.stderr)  # the pool sees the zygote exit and restarts it
        for job in self.busy.values():
            self.destroy(job.child)
        for session_id in list(self.sessions.by_id):
            self.close_session(session_id)  # a container's files go back to the zygote's uid
        for child in self.spares.values():
            if child is not None:
                self.destroy(child)
        self.forker.close()

    def loop(self) -> None:
        while self.running:
            for name, fd in self.streams.select(self.next_timeout()):
                if name == "control":
                    self.on_control()
                elif name == "forker":
                    self.on_forker(self.forker.pending())
                else:
                    job = self.streams.read(fd, self.max_output_bytes)
                    if job is not None:
                        self.finish(job)
            self.check_deadlines()
            self.check_container_disks()
            self.sweep_strays()

    def next_timeout(self) -> float:
        now = time.monotonic()
        times = [job.deadline for job in self.all_jobs()] + self.sessions.expiries()
        if self.container_sessions():
            times.append(self.next_disk_check)
        return max(0.0, min(times) - now) if times else 1.0

    def all_jobs(self) -> list[Job]:
        return list(self.busy.values()) + self.sessions.jobs()

    def on_control(self) -> None:
        try:
            data = os.read(CONTROL_IN, CONTROL_CHUNK)
        except BlockingIOError:
            return
        if not data:
            self.running = False
            return
        for message in self.control.feed(data):
            op = message.get("op")
            if op == "run":
                self.start_job(message)
            elif op == "close_session":
                self.close_session(message.get("session"))
            elif op == "ps":
                self.send({"op": "ps", "id": message.get("id"), "processes": self.process_table()})
            elif op == "cancel":
                self.cancel(message.get("job"))
            elif op == "shutdown":
                self.running = False

    def send(self, message: dict) -> None:
        protocol.write_frame(CONTROL_OUT, message)

    # ------------------------------------------------------------------------------- scheduling
    def start_job(self, request: dict) -> None:
        session_id = request.get("session")
        keep = int(self.cfg["max_output_chars"]) * 4 + 4
        now = time.monotonic()
        if session_id is None:
            slot = self.pick_slot()
            if slot is None:
                self.send(refusal(request["id"], "queue_timeout", "no free worker slot in the zygote"))
                return
            child = self.spares[slot]
            self.spares[slot] = None
            job = Job(request, child, keep, None, now, self.status_max)
            self.busy[slot] = job
        else:
            container = self.container_of(request)
            if container is not None and not os.path.isdir(container.data_dir):
                self.send(refusal(request["id"], "invalid_input", f"container {request['container']} has no directory in the sandbox's containers_dir"))
                return
            session = self.sessions.get(session_id)
            new = session is None
            if session is not None and session.busy:
                self.send(refusal(request["id"], "invalid_input", "this session is already running a cell"))
                return
            try:
                if session is None:
                    session = self.open_session(session_id, container)
                    if session is None:
                        self.send(refusal(request["id"], "queue_timeout", "every session slot is busy"))
                        return
                elif container is not None:
                    own_container(container.data_dir, session.child.uid)  # files uploaded since its last cell
            except OSError as exc:  # the container's directory was deleted meanwhile
                self.send(refusal(request["id"], "invalid_input", f"container {request['container']}: {exc}"))
                return
            if container is not None:
                usage = container_disk.measure(container.data_dir, self.container_caps)
                if over := usage.over(self.container_caps):
                    self.send(refusal(request["id"], "output_limit", f"container {request['container']} holds {over}: delete files before running code in it"))
                    return
                session.disk_before = usage  # what stays if this cell writes past the caps
            if not new:  # a new interpreter has had no time between cells, and its pipes may hold why it failed to start
                self.streams.discard_pending(session.child)
            job = Job(request, session.child, keep, session_id, now, self.status_max)
            job.session_new = new
            session.job = job
        self.streams.watch(job)
        payload = {key: request.get(key) for key in JOB_FIELDS}
        payload["cpu_s"] = max(1, int(float(request["timeout_s"]) + 1))
        try:
            protocol.write_frame(job.child.job, payload)
        except OSError:
            pass  # the child died while hardening; its status message or exit says why

    def ready_slots(self) -> list[int]:
        return [s for s in range(self.slots) if s not in self.busy and self.spares.get(s)]

    def pick_slot(self) -> int | None:
        """The free slot whose spare has had the longest to finish hardening. When no free slot has one yet,
        wait for the forker; a slot whose spare died unused gets a new one now (its job then reports why)."""
        while True:
            ready = self.ready_slots()
            if ready:
                return min(ready, key=lambda s: self.spares[s].born)
            free = [s for s in range(self.slots) if s not in self.busy]
            if not free:
                return None
            waiting = set(self.spawning.values())
            for slot in free:
                if slot not in waiting:
                    self.spawn_spare(slot)
            self.on_forker(self.forker.wait())

    def container_of(self, request: dict) -> Container | None:
        """The container a run request names (its id was checked against launch's pattern by the pool)."""
        if request.get("container") is None:
            return None
        return Container(f"{self.cfg['containers_root']}/{request['container']}/data", request.get("memory_mb"))

    def open_session(self, session_id: str, container: Container | None = None) -> Session | None:
        if not self.sessions.free_indices:
            victim = self.sessions.least_recently_used_idle()
            if victim is None:
                return None
            self.close_session(victim)
        index = self.sessions.reserve_index()
        uid = self.session_uid(index)
        if container is not None:
            try:
                # Before the fork: the child enters the directory as soon as it has dropped to its uid.
                own_container(container.data_dir, uid)
            except OSError:
                self.sessions.release_index(index)
                raise
        child = self.spawn(uid, f"{self.cfg['scratch_root']}/session{index}", True, int(self.cfg["session_cpu_s"]), container)
        return self.sessions.add(session_id, index, child, time.monotonic())

    def close_session(self, session_id: str | None) -> None:
        session = self.sessions.remove(session_id)
        if session is None:
            return
        if session.job is not None and session.job.id is not None:
            # Its caller waits for an answer: without one it waits out the deadline and restarts the zygote.
            session.job.kill_reason, session.job.kill_detail = "internal_error", "The cell was stopped: its session was closed while it ran."
            self.finish(session.job)  # the session is out of the table already, so teardown leaves the rest to us
        if session.job is not None:
            self.streams.unwatch(session.job)
        self.destroy(session.child)
        prepare_scratch(session.child.scratch, None)
        if session.child.container is not None:
            # Back to the zygote's uid: the next session to get this uid may be another container's.
            with contextlib.suppress(OSError):  # the server deleted the container meanwhile
                own_container(session.child.container.data_dir, os.getuid() if self.drop_uid else None)

    def container_sessions(self) -> list[tuple[str, Session]]:
        return [(sid, s) for sid, s in self.sessions.by_id.items() if s.disk_before is not None]

    def check_container_disks(self) -> None:
        """Every CHECK_S, each live container interpreter's data dir against the caps (container_disk.py)."""
        now = time.monotonic()
        if now < self.next_disk_check:
            return
        self.next_disk_check = now + container_disk.CHECK_S
        for sid, session in self.container_sessions():
            data_dir = session.child.container.data_dir
            over = container_disk.measure(data_dir, self.container_caps).over(self.container_caps)
            if over is None:
                continue
            procs.kill_group(session.child.pid)  # nothing may write while the dir is put back
            removed = container_disk.remove_new(data_dir, session.disk_before, session.child.uid)
            note = (f"The code was stopped: its container's files passed the container's cap ({over}); "
                    f"{removed} files and directories written since this cell began were removed.")
            if session.job is not None:
                session.job.kill_reason, session.job.kill_detail = "output_limit", note
                self.finish(session.job)  # and the session goes with its process
            else:  # a thread or process the code left running between cells
                print(f"session {sid}: {note}", file=sys.stderr)
                self.close_session(sid)

    # ------------------------------------------------------------------------ ends of processes
    def on_exit(self, pid: int, status: int) -> None:
        """The forker reaped `pid` (a waitpid status)."""
        self.killed.discard(pid)
        child = self.children.pop(pid, None)
        if child is None:
            return  # an orphaned grandchild the forker inherited as subreaper, or the probe's child
        child.exit_status = status
        job = next((job for job in self.all_jobs() if job.child is child), None)
        if job is not None:
            self.finish(job)
            return
        for slot, spare in list(self.spares.items()):
            if spare is child:
                # A spare died before getting work (hardening failed?). It is replaced when the slot's next
                # job arrives, whose result then carries the reason; respawning here could loop.
                self.streams.close(child)
                self.spares[slot] = None
        for sid, session in list(self.sessions.by_id.items()):
            if session.child is child and not session.busy:
                self.close_session(sid)

    def check_deadlines(self) -> None:
        now = time.monotonic()
        for job in self.all_jobs():
            if now >= job.deadline and job.kill_reason is None:
                job.kill_reason = "timeout"
                self.finish(job)
        for sid in self.sessions.expired(now):
            self.close_session(sid)

    def cancel(self, job_id) -> None:
        """The caller went away (an API client left mid-answer): stop its job now, not at its deadline."""
        for job in self.all_jobs():
            if job.id == job_id and job.kill_reason is None:
                job.kill_reason = "cancelled"
                self.finish(job)

    def finish(self, job: Job) -> None:
        """Answer the job if it is done (or stopped), then tear its child down."""
        if job.id is None:
            return  # already answered
        child = job.child
        if job.kill_reason is None and job.message is None:
            self.streams.read_status(job)
            if job.message is None and child.exit_status is None:
                return  # still running, or its status pipe closed while it runs on: wait for its exit or the deadline
        if job.kill_reason is not None:
            procs.kill_group(child.pid)
        self.streams.drain(job, self.max_output_bytes)
        self.send(answer(job, int(self.cfg["max_output_chars"]), time.monotonic()))
        job.id = None
        self.teardown(job)

    def teardown(self, job: Job) -> None:
        self.streams.unwatch(job)
        if job.session is not None:
            session = self.sessions.get(job.session)
            if session is not None and session.job is job:
                session.job = None
                session.last_used = time.monotonic()
                if job.kill_reason is not None or job.child.exit_status is not None:
                    self.close_session(job.session)  # its state is gone with the process
            return
        slot = next(s for s, j in self.busy.items() if j is job)
        del self.busy[slot]
        self.destroy(job.child)
        self.spawn_spare(slot)

    def destroy(self, child: Child) -> None:
        """Kill everything the child started: its process group, and without seccomp (when a cell can leave
        its group) everything running as its uid."""
        procs.kill_group(child.pid)
        if child.uid is not None and not self.groups_sealed:
            procs.kill_uid(child.uid)
        if child.pid in self.children:
            self.killed.add(child.pid)
        self.streams.close(child)

    def sweep_strays(self) -> None:
        """The safety net behind killpg when groups are sealed: every STRAY_SWEEP_S, kill cell-uid processes
        outside the group of every live child (or of one being killed). Finding one means a way out of the group exists: say so."""
        now = time.monotonic()
        if not (self.drop_uid and self.groups_sealed) or now - self.last_sweep < STRAY_SWEEP_S:
            return
        if self.forker.asked:
            return  # a child forked for a request not yet answered runs as a cell uid in a group we do not know yet
        self.last_sweep = now
        strays = procs.kill_strays(self.uid_base, self.uid_count(), set(self.live_children()) | self.killed)
        if strays:
            print(f"killed {len(strays)} cell processes outside their cell's process group: {strays}", file=sys.stderr)

    def uid_count(self) -> int:
        return self.slots + int(self.cfg["max_sessions"])

    def live_children(self) -> dict[int, str]:
        """pid -> role of every child the zygote holds (each one leads its own process group)."""
        roles = {}
        for child in self.spares.values():
            if child is not None:
                roles[child.pid] = "spare"
        for job in self.busy.values():
            roles[job.child.pid] = "running"
        for session in self.sessions.by_id.values():
            roles[session.child.pid] = "session"
        return roles

    def process_table(self) -> list[dict]:
        """Every process in our pid namespace that runs as a cell uid, for /health and leak tests."""
        roles = self.live_children()
        table = []
        for pid, uid, state in procs.cell_processes(self.uid_base, self.uid_count()):
            role = "exiting" if state in ("Z", "X") or pid in self.killed else roles.get(pid, "stray")
            table.append({"pid": pid, "uid": uid, "role": role})
        if not self.drop_uid:  # no uids to look for: list what we track
            table = [{"pid": pid, "uid": None, "role": role} for pid, role in roles.items()]
        return table


def _network_check() -> str:
    """Inside bwrap's empty network namespace even the zygote cannot route anywhere."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never a real host
        return "routable"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    finally:
        probe.close()


def main() -> None:
    """Entry point inside the sandbox: read the config frame, warm up, report, serve."""
    cfg = protocol.read_frame(CONTROL_IN)
    if cfg is None:
        return
    for key, value in cfg.get("thread_env", {}).items():
        os.environ[key] = value  # BLAS thread counts must be set before numpy loads its library
    os.set_blocking(CONTROL_OUT, True)
    sys.stdout = sys.stderr  # fd 1 carries protocol frames: a stray print from a library must not land there
    os.makedirs(cfg["scratch_root"], exist_ok=True)
    forker, forker_ready = Forker.start(cfg)
    zygote = Zygote(cfg, forker)
    report = zygote.probe()
    report["warmup_s"] = forker_ready["warmup_s"]
    report["preloaded"] = cfg.get("preload", [])
    report["released_memory"] = forker_ready["released_memory"]
    report["huge_page_mb"] = forker_ready["huge_page_mb"]
    zygote.send({"op": "ready", "report": report})
    zygote.serve()
