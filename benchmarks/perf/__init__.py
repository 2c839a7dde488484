"""Speed and memory benchmarks: training, decoding, serving, orchestration and lineage, the data layer."""
