"""Sandbox knobs, nested in rstar's Settings as `sandbox` (env: RSTAR_SANDBOX__<FIELD>)."""

from pydantic import BaseModel, Field, field_validator

# A container's caps; the API's ContainerSettings starts from the same ones, and `rstar serve` hands its own to the sandbox.
CONTAINER_MAX_FILES = 100
CONTAINER_MAX_BYTES = 200 * 2**20


class SandboxSettings(BaseModel):
    # --- semantics
    timeout_s: float = Field(4.0, description="Wall-clock limit per call (rStar2-Agent's README runs code-judge with 4 s).")
    max_timeout_s: float = Field(60.0, description="Largest timeout a single request may ask for.")
    max_output_chars: int = Field(1000, description="stdout and stderr are each cut to this many characters (code-judge's MAX_STDOUT_ERROR_LENGTH).")
    max_output_bytes: int = Field(1_048_576, description="A call whose stdout+stderr exceed this many bytes is killed (status output_limit); enforced while reading.")
    max_code_chars: int = Field(200_000, description="Largest cell accepted; longer code gets an invalid_input result.")
    max_input_chars: int = Field(1_000_000, description="Largest stdin accepted.")
    max_history_cells: int = Field(64, description="jupyter_code replay keeps at most this many earlier cells (replay cost grows with history).")
    # --- pool
    workers: int = Field(2, description="Cells that may run at once in one pool (one pre-forked spare per worker).")
    spare_cells: int = Field(2, description="Hardened children kept ready beyond the workers, so a call never waits for a fork.")
    max_queue: int = Field(1024, description="Calls that may wait for a worker; beyond that a call is answered queue_timeout at once.")
    queue_timeout_s: float = Field(60.0, description="A call that waited this long for a worker is answered queue_timeout.")
    long_batch_queue_timeout_s: float = Field(3600.0, description="Queue wait allowed for code-judge's /run/long-batch.")
    preload: list[str] = Field(
        ["numpy", "sympy", "scipy", "scipy.linalg", "scipy.optimize", "scipy.special", "scipy.integrate", "scipy.stats",
         "math_verify", "matplotlib", "matplotlib.pyplot"],
        description="Modules imported once in the zygote so cells pay no import cost (scipy loads its subpackages lazily, so the common ones are named; "
        "matplotlib comes with the Agg backend and its PNG writer, so a cell's figures cost their drawing only).")
    # --- figures (matplotlib, returned as PNG)
    max_images_per_cell: int = Field(8, ge=0, description="Figures one cell may return; the rest are left out with a note saying how many.")
    max_image_pixels: int = Field(4_194_304, ge=1, description="Largest figure returned, in pixels (width x height; 2048x2048 by default); a larger one is not drawn and a note says so.")
    max_image_bytes: int = Field(2_097_152, ge=1, description="Largest PNG returned, in bytes; a larger one is left out with a note.")
    # --- limits per cell
    memory_mb: int = Field(2048, description="Address-space cap per cell (RLIMIT_AS); the preloaded libraries already map ~0.5 GB.")
    max_processes: int = Field(32, description="Processes+threads per cell (RLIMIT_NPROC on the slot's own uid).")
    max_open_files: int = Field(256, description="Open files per cell (RLIMIT_NOFILE).")
    max_file_size_mb: int = Field(16, description="Largest file a cell may write (RLIMIT_FSIZE).")
    scratch_mb: int = Field(256, description="Size of the tmpfs holding every cell's scratch directory.")
    uid_base: int = Field(61000, description="Cells run as uid_base+slot (sessions above the slots); needs root, else cells keep the caller's uid.")
    containers_dir: str | None = Field(
        None, description="Host directory of the API's containers (`<id>/data` each): a cell named by a container works in its data dir, seen "
        "at /mnt/data. `rstar serve` sets it to data_dir/containers; a separate sandbox service needs the same directory (a shared volume).")
    container_max_files: int = Field(
        CONTAINER_MAX_FILES, ge=1, description="Entries (files, directories, links, at any depth) a container's data dir may hold while code runs in it: "
        "past it the interpreter is killed and what its latest cell wrote is removed. `rstar serve` sets it to containers.max_files.")
    container_max_bytes: int = Field(
        CONTAINER_MAX_BYTES, ge=1, description="Bytes a container's data dir may hold while code runs in it, enforced as container_max_files is. "
        "`rstar serve` sets it to containers.max_bytes.")
    # --- sessions (chat)
    max_sessions: int = Field(8, description="Persistent sessions kept at once; the least recently used idle one is evicted.")
    session_ttl_s: float = Field(600.0, description="A session idle this long is killed and its state dropped.")
    session_cpu_s: int = Field(120, description="CPU seconds a whole session may use.")
    # --- answer checking
    verify_timeout_s: float = Field(10.0, description="Wall-clock limit for one verify() call.")
    # --- isolation
    unsafe_no_isolation: bool = Field(False, description="Run without bubblewrap/seccomp/Landlock. Never on a shared machine.")
    bwrap_path: str = Field("bwrap", description="bubblewrap binary (name on PATH or absolute path).")
    # --- service
    host: str = "127.0.0.1"
    port: int = 8088
    token: str | None = Field(
        None, description="Bearer token `rstar sandbox serve` requires on every route but /health, and its clients send; required off loopback."
    )
    max_batch: int = Field(1024, ge=1, description="Most requests (or code-judge submissions) one batch may carry.")
    # --- cluster
    ray_address: str | None = Field(None, description="Ray cluster for RayPool ('auto', 'ray://host:10001'); None starts a local Ray.")
    ray_pools_per_node: int = Field(1, description="Zygote pools RayPool starts on each Ray node.")

    @field_validator("token")
    @classmethod
    def _a_real_token(cls, token: str | None) -> str | None:
        if token is not None and not token.strip():
            raise ValueError("an empty token is no token: unset the variable, or give it a real value")
        return token
