"""Isolated, warm Python executor for the model's tool calls (installed as `rstar.sandbox`).

Kept import-light: the zygote imports this package inside bubblewrap with nothing but the standard library
and the preloaded modules on its path. Modules, one idea each:

    settings   SandboxSettings, every knob with its default
    schemas    wire models (ours and rStar2-Agent's code-judge), to_code_judge()
    pool       SandboxPool: bounded queue, zygote lifecycle, tool semantics
    launch     feature detection, the bubblewrap command line, the /health layer report
    zygote     the warm fork server: start-up and the event loop (runs inside the sandbox), driving
      child      forking a cell process and what runs in it: hardening, jobs, the self-probe
      jobs       a call in flight and the answer frame it becomes
      streams    the selector over every pipe, non-blocking reads, the output cap
      sessions   chat-mode sessions: indices, idle eviction, TTL
    procs      cell processes by uid (/proc) and killing them; the host uses it to find leftovers
    harden     rlimits, uid drop, no_new_privs, Landlock, seccomp
    cell       exec with IPython-style echo, short error messages, jupyter_code replay
    protocol   length-prefixed JSON frames
    verify     answer extraction and math-verify/integer comparison
    service    FastAPI routes; cli: `rstar sandbox serve`
    clients    SandboxClient: in-process, HTTP; ray_pool: one pool per Ray node
"""
