"""The benchmark GPT's shape, token batches and step statistics, shared by the Python peers of bench/gpt_step.cpp
(gpt_step_torch.py, gpt_step_jax.py): the same splitmix64 draw as bench/bench_common.h."""
import resource
import statistics

VOCAB, BLOCK, EMBD, HEADS, LAYERS, BATCH, NBATCHES = 114, 64, 128, 4, 4, 16, 4
MASK64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def make_batches(batch=BATCH):
    """NBATCHES (inputs, targets) of [batch, BLOCK] token ids, as bench/bench_common.h draws them."""
    s, out = 1234, []
    for _ in range(NBATCHES):
        x, y = [], []
        for _ in range(batch):
            row = []
            for _ in range(BLOCK + 1):
                s, r = splitmix64(s)
                row.append(r % VOCAB)
            x.append(row[:-1])
            y.append(row[1:])
        out.append((x, y))
    return out


def max_rss_mib():
    """The process's peak resident memory in MiB (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def step_stats(times):
    """(median, p10, p90) of the timed steps' milliseconds."""
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times * 9
    return statistics.median(times), q[0], q[-1]
