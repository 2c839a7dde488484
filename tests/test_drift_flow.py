"""The drift-check flow: its final state follows the check's verdicts on the inputs and on the answers."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_drift_flow_fails_on_drift_and_completes_otherwise(tmp_path, prefect_harness, monkeypatch):
    """The flow's final state follows the check's verdict; every run leaves the markdown artifact."""
    import monitoring.drift as drift_mod
    from pipelines.drift_flow import drift

    signal = {"n": 60, "flagged": 40, "share": 0.67, "expected": 0.02, "p_value": 1e-9, "alarm": True}
    alarm = {"verdict": "alarm", "answered": 60, "signals": {"copy_rate": signal}, "alarms": ["copy_rate"]}
    verdicts = {"drift": ({"verdict": "drift", "drifted": ["src_lang_score", "embeddings"]}, "Failed"),
                "no_drift": ({"verdict": "no_drift"}, "Completed"),
                "insufficient_data": ({"verdict": "insufficient_data", "reason": "5 sentences < 30"}, "Completed"),
                "answers": ({"verdict": "no_drift", "outputs": alarm}, "Failed"),
                "both": ({"verdict": "drift", "drifted": ["src_lang_score"], "outputs": alarm}, "Failed")}
    base = {"window": {"sentences": 200, "file": "w.txt"}, "reference": {"sentences": 10, "split": "train"},
            "descriptors": {}, "embeddings": None, "drift_share": 0.25, "drifted_share": 0.5}
    for verdict, (extra, state_name) in verdicts.items():
        monkeypatch.setattr(drift_mod, "run_check", lambda *a, _s={**base, **extra}, **k: (_s, tmp_path))
        state = drift(root=str(tmp_path), params_path=str(REPO / "params.yaml"), return_state=True)
        assert state.name == state_name, (verdict, state.message)
        if verdict == "drift":
            assert "src_lang_score, embeddings" in state.message
        if verdict in ("answers", "both"):  # an answers alarm never hides an input drift, nor the reverse
            assert "answers look broken in 60 answers: copy_rate" in state.message, state.message
            assert state.message.startswith("drift in 200 production inputs") == (verdict == "both"), state.message
    def cannot(*a, **k):
        raise drift_mod.DriftCheckError("no serving log at x")
    monkeypatch.setattr(drift_mod, "run_check", cannot)
    state = drift(root=str(tmp_path), params_path=str(REPO / "params.yaml"), return_state=True)
    assert state.is_failed() and "could not run: no serving log" in state.message
