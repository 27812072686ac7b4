"""Predictor benchmarks: accuracy on the synthetic mix and ingest throughput (``python -m bench.predictor``)."""
