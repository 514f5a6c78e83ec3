"""torch's side of FsdpPlanAccounting (tests/tools/test_fsdp_plan.cpp): the FLOPs of one training
step of each model, as torch.utils.flop_counter.FlopCounterMode counts them.

CONFIGS holds one directory per model, named after it, with the config.json our model spec
writes (hf_config_json). Each becomes transformers' model for that config, at random, with eager
attention: its score and value products are batched matmuls over the whole T x T square, which
is what the planner charges for attention (the causal mask is applied after the product, so
nothing is skipped). One step is a forward of BATCH sequences of SEQ tokens, the causal-LM loss
and the backward, all under the counter. OUT gets {model: {"total": FLOPs, "by_op": {op: FLOPs}}}.

usage: model_flops.py BATCH SEQ CONFIGS OUT
"""
import json
import os
import sys

try:
    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode
except ImportError as e:  # never skip silently
    sys.exit(f"model_flops.py: {e}; install the Python packages with "
             f"'{sys.executable} -m pip install transformers'")


def training_step_flops(config_dir, batch, seq):
    config = transformers.AutoConfig.from_pretrained(config_dir)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    tokens = torch.randint(config.vocab_size, (batch, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=tokens, labels=tokens).loss.backward()
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    return {"total": counter.get_total_flops(), "by_op": by_op}


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    batch, seq, configs, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    transformers.logging.set_verbosity_error()
    result = {name: training_step_flops(os.path.join(configs, name), batch, seq)
              for name in sorted(os.listdir(configs))}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({name: r["total"] for name, r in result.items()}))


if __name__ == "__main__":
    main()
