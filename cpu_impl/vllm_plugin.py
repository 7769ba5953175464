"""specdiff's C++ port as vLLM's CPU kernels: a vLLM general plugin (entry point group
``vllm.general_plugins``, name ``specdiff``; pyproject.toml).

vLLM loads general plugins in every process before its worker lets the platform replace Triton
kernels (``vllm/v1/worker/worker_base.py``: ``load_general_plugins()``, then
``current_platform.register_triton_kernel_overrides()``). A plugin that registered at load time
would be overwritten by ``CpuPlatform``'s own registration a moment later, so :func:`register`
extends that platform hook instead: vLLM's registration runs first, then specdiff's launchers are
registered over it through vLLM's own registry (``vllm/triton_utils/dispatcher.py``:
``register_kernels``, which wraps each in its ``KernelOverride`` and rebinds every module that
imported the kernel). With Triton-CPU installed vLLM skips its own overrides; specdiff still
registers, as installing the plugin asks for its port.

On any other platform the plugin does nothing. ``VLLM_PLUGINS`` (vLLM's allowlist) turns it off:
set it to the plugins wanted, without ``specdiff``.
"""

from __future__ import annotations

from typing import Any

from contracts import dflash, eagle, rejection, slot_mapping

# The kernels vLLM 0.33.0's CpuPlatform overrides (vllm/platforms/cpu.py:711-742), all of which
# specdiff ports; their contracts hold the qualnames the registry resolves.
FAMILIES = (rejection, eagle, dflash, slot_mapping)


def launchers() -> dict[str, Any]:
    """qualname -> specdiff's launcher, for every V1 kernel of vLLM's CPU path."""
    from cpu_impl import dflash as cd
    from cpu_impl import eagle as ce
    from cpu_impl import rejection as cr
    from cpu_impl import slot_mapping as cs

    modules = {"rejection": cr, "eagle": ce, "dflash": cd, "slot_mapping": cs}
    return {spec.qualname: getattr(modules[spec.family], spec.name) for family in FAMILIES for spec in family.SPECS}


def install(register_kernels: Any) -> None:
    """Registers every launcher with ``register_kernels`` (vLLM's, or a test's copy of it)."""
    register_kernels(launchers())


def register() -> None:
    """The plugin's entry point: on vLLM's CPU platform, specdiff's launchers become the kernels
    after the platform registered its own. Idempotent: vLLM may load plugins more than once."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    platform = type(current_platform)
    own = platform.register_triton_kernel_overrides
    if getattr(own, "specdiff", False):
        return

    def register_triton_kernel_overrides(cls: type) -> None:
        own()
        from vllm.triton_utils.dispatcher import register_kernels

        install(register_kernels)

    register_triton_kernel_overrides.specdiff = True  # type: ignore[attr-defined]
    platform.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)  # type: ignore[method-assign]
