"""CPU_EXTRA_BUFFERS resolved: whether llama.cpp may put weights in its extra CPU buffer types.

The extra buffer types are llama.cpp's repacked weight layouts (``CPU_REPACK``) and, in a build
with its AMX kernels, the ``AMX`` buffer. Those AMX kernels crash on CPUs that have AMX
(llama.cpp#20824: SIGSEGV in ggml_backend_amx_mul_mat at the first decode), so ``auto`` keeps
every extra buffer type off in such a build; this project's installs build without them
(cmake/no-amx.cmake), where ``auto`` is on. ``off`` is llama-server's ``--no-repack``.
"""

from __future__ import annotations

import re

AMX_ISSUE = "https://github.com/ggml-org/llama.cpp/issues/20824"
# llama_print_system_info() lists a build's CPU features: "AMX_INT8 = 1" when compiled in
_AMX = re.compile(r"\bAMX_INT8\s*=\s*1\b")


def built_with_amx(system_info: str) -> bool:
    """Whether this llama.cpp was compiled with its AMX kernels (a compile-time feature)."""
    return bool(_AMX.search(system_info))


def resolve(mode: str, system_info: str) -> tuple[bool, str]:
    """(use the extra buffer types, why) for CPU_EXTRA_BUFFERS ``mode``."""
    if mode == "on":
        return True, "CPU_EXTRA_BUFFERS=on"
    if mode == "off":
        return False, "CPU_EXTRA_BUFFERS=off"
    if built_with_amx(system_info):
        return False, ("CPU_EXTRA_BUFFERS=auto: off, because this llama.cpp was built with its "
                       f"AMX kernels, which crash on CPUs that have AMX ({AMX_ISSUE}); install "
                       "it as the README's install command does (cmake/no-amx.cmake), or set "
                       "CPU_EXTRA_BUFFERS=on to use them anyway")
    return True, "CPU_EXTRA_BUFFERS=auto"
