from torch import nn


class Qwen3ForCausalLM(nn.Module):
    pass


EntryClass = Qwen3ForCausalLM
