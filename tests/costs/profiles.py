"""Hand-written latency profiles the costs tests share: two CPUs' measured shapes, by model and dtype."""

from viasd_adapters.costs import LatencyEntry, LatencyProfile

T, D = "target-1.5b", "draft-0.5b"


def profile_of(table: dict, threads: int = 2, context: int = 128) -> LatencyProfile:
    """{(model, dtype): {new_tokens: ms}} -> a profile."""
    return LatencyProfile(
        entries=[
            LatencyEntry(model, dtype, threads, context, n, ms)
            for (model, dtype), row in table.items()
            for n, ms in row.items()
        ]
    )


# Measured on two CPUs: Intel AMX (bf16 verify nearly free) and AMD Zen 3 (a verify of M
# tokens costs nearly M steps in bf16; fp32 is slower per step but grows less).
INTEL = profile_of(
    {
        (T, "bfloat16"): {1: 216, 8: 223, 16: 242},
        (D, "bfloat16"): {1: 101},
        (T, "float32"): {1: 279, 8: 814},
        (D, "float32"): {1: 150},
    }
)
AMD = profile_of(
    {
        (T, "bfloat16"): {1: 287, 4: 832, 8: 1530, 16: 2756},
        (D, "bfloat16"): {1: 98, 4: 274},
        (T, "float32"): {1: 497, 4: 1658, 8: 1628, 16: 2268},
    }
)
