"""The paper grid on the discrete-event simulator (`python -m bench.sim`)."""
