# Reference output for tests/data/test_sampler.cpp: the indices that PyTorch's own
# torch.utils.data.DistributedSampler yields, one line per case, so the C++ port can be
# compared against the real thing. Run with Debian's /usr/bin/python3 (python3-torch).
#
# usage: sampler_reference.py N,REPLICAS,RANK,SEED,EPOCH,SHUFFLE,DROP_LAST ...
# prints: "len(sampler): i0 i1 ..." per case, or a single "SKIP <reason>" if torch is missing.
import sys

try:
    import torch
    from torch.utils.data import DistributedSampler
except Exception as e:  # ImportError, or a broken install
    print("SKIP cannot import torch with %s: %s" % (sys.executable, e))
    sys.exit(0)

for case in sys.argv[1:]:
    n, replicas, rank, seed, epoch, shuffle, drop_last = (int(x) for x in case.split(","))
    sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank,
                                 shuffle=bool(shuffle), seed=seed, drop_last=bool(drop_last))
    sampler.set_epoch(epoch)
    print("%d: %s" % (len(sampler), " ".join(str(i) for i in sampler)))
