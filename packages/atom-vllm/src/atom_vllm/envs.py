"""Environment switches of the vLLM plugin: ATOM_DISABLE_VLLM_PLUGIN, ATOM_DISABLE_VLLM_PLUGIN_ATTENTION
(ATOM models on vLLM's own attention backend) and ATOM_SKIP_VLLM_VERSION_CHECK
(atom_core.envs.HostSwitches says what each does)."""

from atom_core.envs import HostSwitches

SWITCHES = HostSwitches("VLLM")
plugin_disabled = SWITCHES.plugin_disabled
attention_disabled = SWITCHES.attention_disabled
