"""Isolated, warm Python executor for the model's tool calls (installed as `rstar.sandbox`).

Kept import-light: the zygote imports this package inside bubblewrap with nothing but the standard library
and the preloaded modules on its path. Modules, one idea each:

    settings   SandboxSettings, every knob with its default
    schemas    wire models (ours and rStar2-Agent's code-judge), to_code_judge()
    pool       SandboxPool: bounded queue, zygote lifecycle, tool semantics
    launch     feature detection, the bubblewrap command line, the /health layer report
    zygote     the warm fork server and its hardened children (runs inside the sandbox)
    harden     rlimits, uid drop, no_new_privs, Landlock, seccomp
    cell       exec with IPython-style echo, short error messages, jupyter_code replay
    protocol   length-prefixed JSON frames
    verify     answer extraction and math-verify/integer comparison
    service    FastAPI routes; cli: `rstar sandbox serve`
    clients    SandboxClient: in-process, HTTP; ray_pool: one pool per Ray node
"""
