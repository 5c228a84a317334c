"""Sandbox knobs, nested in rstar's Settings as `sandbox` (env: RSTAR_SANDBOX__<FIELD>)."""

from pydantic import BaseModel, Field


class SandboxSettings(BaseModel):
    timeout_s: float = Field(4.0, description="Wall-clock limit per call (rStar2-Agent's README runs code-judge with 4 s).")
    max_output_chars: int = Field(1000, description="stdout and stderr are each cut to this many characters (code-judge's MAX_STDOUT_ERROR_LENGTH).")
    workers: int = Field(2, description="Cells that may run at once in one pool.")
    host: str = "127.0.0.1"
    port: int = 8088
    unsafe_no_isolation: bool = Field(False, description="Run without bubblewrap/seccomp/Landlock. Never on a shared machine.")
