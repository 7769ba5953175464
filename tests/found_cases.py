"""Cases that runs found, frozen as explicit examples (`specdiff show FILE` printed each one).

Hypothesis keeps what it finds in its example database, which a fresh clone and CI do not have.
Pasted here, each case runs first in its kernel's three-way conformance test
(`tests/test_rejection.py`, through `@example`), on every machine, for good; and where it is an
engine defect, `tests/test_engine.py` checks the engine still shows it (delete the case's
`ENGINE` entry, not the case, when vLLM fixes it).
"""

import torch

from conformance.case import Case

# D1 (conformance/engine/expected.toml): vLLM's CPU port leaves a float32 expand output unwritten
# (its adapter writes into an int64 copy). Found by `nox -s engine`.
D1 = Case(
    "expand_kernel",
    {
        "output_ptr": torch.tensor([0.0, 0.0, 0.0], dtype=torch.float32),
        "input_ptr": torch.tensor([0.0], dtype=torch.float32),
        "cu_num_tokens_ptr": torch.tensor([3], dtype=torch.int32),
        "replace_from": 0,
        "replace_to": 0,
        "MAX_NUM_TOKENS": 1,
    }
)

# D8: vLLM's CPU port ignores MAX_NUM_TOKENS and writes every slot of a longer request.
D8 = Case(
    "expand_kernel",
    {
        "output_ptr": torch.tensor([0, 0, 0, 0, 0, 0, 0, 0], dtype=torch.int64),
        "input_ptr": torch.tensor([0, 0, 0, 16052], dtype=torch.int64),
        "cu_num_tokens_ptr": torch.tensor([3, 6, 6, 8], dtype=torch.int32),
        "replace_from": 0,
        "replace_to": 1,
        "MAX_NUM_TOKENS": 1,
    }
)

# D4: a -1 (placeholder) draft: vLLM's CPU port reads the probability before the row (out of
# bounds for the first draft token) where the contract emits the recovered token (C10).
D4 = Case(
    "rejection_random_sample_kernel",
    {
        "output_token_ids_ptr": torch.tensor([
            [-1, -1, -1, -1],
        ], dtype=torch.int32),
        "cu_num_draft_tokens_ptr": torch.tensor([1], dtype=torch.int32),
        "draft_token_ids_ptr": torch.tensor([-1], dtype=torch.int32),
        "draft_probs_ptr": torch.tensor([
            [0.041534614, 0.007815649, 0.014913256, 0.00034671425, 0.009063559, 0.0058563044,
                0.027332414, 0.047222286, 0.0035052581, 0.0008917864, 0.021885084, 0.010220166,
                0.002120283, 0.011794499, 0.19791779, 0.03624126, 0.019265098, 0.064364046,
                0.0180061, 0.10340011, 0.009278262, 0.030416971, 0.014927414, 0.041939534,
                0.0043654973, 0.025574613, 0.0011015596, 0.08455381, 0.049861077, 0.05538659,
                0.038898386],
        ], dtype=torch.float32),
        "target_probs_ptr": torch.tensor([
            [0.015961654, 0.031554487, 0.015145414, 0.028836697, 0.0035791097, 0.008036641,
                0.028559096, 0.014195054, 0.008454944, 0.089924976, 0.024020454, 0.019088227,
                0.015485099, 0.032833055, 0.030263234, 0.035860702, 0.07666744, 0.010208117,
                0.041035473, 0.059414323, 0.0026692678, 0.08115089, 0.027038759, 0.04984704,
                0.0058355024, 0.06452215, 0.016424332, 0.114823006, 0.025452934, 0.013321478,
                0.009790369],
        ], dtype=torch.float32),
        "bonus_token_ids_ptr": torch.tensor([
            [10],
        ], dtype=torch.int32),
        "recovered_token_ids_ptr": torch.tensor([12], dtype=torch.int32),
        "uniform_probs_ptr": torch.tensor([0.0], dtype=torch.float64),
        "is_greedy_ptr": torch.tensor([False], dtype=torch.bool),
        "max_spec_len": 3,
        "vocab_size": 31,
        "synthetic_conditional_rates_ptr": None,
        "NO_DRAFT_PROBS": False,
        "SYNTHETIC_MODE": False,
    }
)

# By kernel, for the three-way tests' @example lists.
FOUND = {"expand_kernel": [D1, D8], "rejection_random_sample_kernel": [D4]}
# The engine defects that reproduce deterministically (D4 reads memory before the buffer: what it
# reads is not fixed): (case, engine backend, output, kind of difference).
ENGINE = [(D1, "vllm-cpu", "output_ptr", "unwritten"), (D8, "vllm-cpu", "output_ptr", "stray write")]
