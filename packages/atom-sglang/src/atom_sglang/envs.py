"""Environment switches of the SGLang plugin: ATOM_DISABLE_SGLANG_PLUGIN,
ATOM_DISABLE_SGLANG_PLUGIN_ATTENTION (ATOM models on SGLang's default attention backend;
``--attention-backend atom`` still selects ATOM's explicitly) and ATOM_SKIP_SGLANG_VERSION_CHECK
(atom_core.envs.HostSwitches says what each does)."""

from atom_core.envs import HostSwitches

SWITCHES = HostSwitches("SGLANG")
plugin_disabled = SWITCHES.plugin_disabled
attention_disabled = SWITCHES.attention_disabled
