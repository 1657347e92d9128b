"""Peak parameter + gradient + optimizer bytes per rank against two bounds (issue 12).

From main_job's summary.json (peak_bytes_per_rank by tag, fsdp_units, limit_all_gathers,
world_size), for FULL_SHARD with fp32 AdamW:

- measured: peak(param) + peak(grad) + peak(optim) of the rank (each tag's own peak, so
  an upper bound of their simultaneous sum);
- issue_bound: 16 Psi / N + 4 P_max, the issue's formula (Psi the parameters, P_max the
  largest unit's elements);
- fsdp_bound: NOTE [FULL_SHARD memory bound] of fsdp/comm_memory_test.cc, which the unit
  test asserts within 5%: 16 sum(P_u) / N + 8 P_root + 4 P_block (1 + L) + 8 P_block
  (the root's parameters and full gradient for the whole backward, the computing block's
  and L prefetched blocks' parameters, two blocks' full gradients while a reduce-scatter
  is in flight); on one rank without the full gradients (8 P_root becomes 4 P_root, and
  no 8 P_block): its backward adds straight into the gradient shards.

The difference between the two bounds is prefetch and gradient buffers that the issue's
formula leaves out; every FSDP that reduces per unit holds them.
"""


def memory_check(summary):
    units = summary.get("fsdp_units") or []
    if not units:
        return None
    n = summary["world_size"]
    L = summary.get("limit_all_gathers", 2)
    peaks = summary["peak_bytes_per_rank"]
    measured = max(p["param"] + p["grad"] + p["optim"] for p in peaks)
    psi = summary["model_parameters"]
    root = [u for u in units if u["label"].startswith("<root>")]
    blocks = [u for u in units if not u["label"].startswith("<root>")]
    p_max = max(u["padded_numel"] for u in units)
    p_root = root[0]["padded_numel"] if root else 0
    p_block = max((u["padded_numel"] for u in blocks), default=0)
    padded_total = sum(u["padded_numel"] for u in units)
    issue_bound = 16 * psi // n + 4 * p_max
    fsdp_bound = 16 * padded_total // n + 4 * p_root + 4 * p_block * (1 + L)
    if n > 1:
        fsdp_bound += 4 * p_root + 8 * p_block
    return {
        "measured_param_grad_optim_bytes": measured,
        "issue_bound_bytes": issue_bound,
        "issue_bound_formula": "16 Psi / N + 4 P_max",
        "measured_over_issue_bound": measured / issue_bound,
        "fsdp_bound_bytes": fsdp_bound,
        "fsdp_bound_formula": ("16 sum P_u / N + 8 P_root + 4 P_block (1 + L) + 8 P_block"
                               if n > 1 else "16 sum P_u + 4 P_root + 4 P_block (1 + L)")
                              + " (NOTE [FULL_SHARD memory bound], fsdp/comm_memory_test.cc)",
        "measured_over_fsdp_bound": measured / fsdp_bound,
        "limit_all_gathers": L,
    }
