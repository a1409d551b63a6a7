"""Prometheus metrics (#29), scraped from the real endpoints over HTTP: a worker's
``--metrics-port`` and the inspector's ``/metrics``; a port in use is one error line."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")

from prometheus_client.parser import text_string_to_metric_families

import pitstop
import workflows
from clitools import PITSTOP, one_error_line, pitstop_exe
from conftest import ROOT
from ui_browser import Server, free_port


def _scrape(url: str, headers: dict[str, str] | None = None) -> dict[tuple[str, tuple], float]:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _value(samples: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PITSTOP_STORE"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    env["JOB_STEP_DELAY"] = "0"
    return env


@pytest.mark.slow
def test_worker_metrics_port_serves_counts_histograms_and_store_gauges(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    log = str(tmp_path / "log.txt")
    store = pitstop.open_store(url)
    try:
        for i in range(3):
            workflows.jobs.enqueue(store, {"n": i, "log": log, "trail": []}, run_id=f"job-{i}")
        workflows.approval.enqueue(store, {"amount": 5}, run_id="queued-elsewhere")
        port = free_port()
        worker = subprocess.Popen(
            [PITSTOP, "worker", "--store", url, "--workflow", "workflows:jobs",
             "--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--poll", "0.1"],
            cwd=ROOT, env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                done = store.count_runs(status=pitstop.RunStatus.COMPLETED).get("completed", 0)
                if done == 3:
                    break
                assert worker.poll() is None, worker.communicate()
                time.sleep(0.1)
            samples = _scrape(f"http://127.0.0.1:{port}/metrics")
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    finally:
        store.close()
    assert _value(samples, "pitstop_steps_total", workflow="jobs", outcome="ok") == 9
    assert _value(samples, "pitstop_checkpoints_total", workflow="jobs",
                  status="completed") == 3
    assert _value(samples, "pitstop_checkpoint_seconds_count", workflow="jobs") >= 3
    assert _value(samples, "pitstop_checkpoint_bytes_count", workflow="jobs") >= 3
    assert _value(samples, "pitstop_runs", workflow="jobs", status="completed") == 3
    assert _value(samples, "pitstop_runs", workflow="approval", status="queued") == 1
    assert _value(samples, "pitstop_queue_depth") == 1
    assert _value(samples, "pitstop_oldest_queued_seconds") > 0
    # Bounded labels: no run id anywhere.
    assert not any("job-" in value for _, labels in samples for _, value in labels)


@pytest.mark.slow
def test_a_metrics_port_in_use_is_one_error_line(tmp_path: Path) -> None:
    pitstop.open_store(f"sqlite:///{tmp_path / 'p.db'}").close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = pitstop_exe("worker", "--workflow", "workflows:jobs", "--until-idle",
                             "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
                             store=f"sqlite:///{tmp_path / 'p.db'}",
                             env={"PYTHONPATH": _env()["PYTHONPATH"]})
    line = one_error_line(result)
    assert f"--metrics-port {port}" in line and "in use" in line


@pytest.mark.slow
def test_inspector_serves_metrics_behind_its_token(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    store = pitstop.open_store(url)
    try:
        workflows.approval.enqueue(store, {"amount": 5}, run_id="waiting-one")
    finally:
        store.close()
    server = Server(url, "--token", "scraper:secret-token-1")
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            _scrape(server.url + "/metrics")
        assert refused.value.code == 401
        samples = _scrape(server.url + "/metrics",
                          {"authorization": "Bearer secret-token-1"})
    finally:
        server.stop()
    assert _value(samples, "pitstop_runs", workflow="approval", status="queued") == 1
    assert _value(samples, "pitstop_queue_depth") == 1


def test_a_failing_store_read_does_not_fail_the_scrape(tmp_path: Path) -> None:
    from pitstop.observe import metrics

    registry = metrics.Metrics()
    store = pitstop.open_store(f"sqlite:///{tmp_path / 'gone.db'}")
    registry.watch(store)
    store.close()  # every read now fails
    from prometheus_client import generate_latest

    generate_latest(registry.registry)  # counts the failed read (after it was reported)
    text = generate_latest(registry.registry).decode()
    assert "pitstop_scrape_errors_total 1.0" in text
    assert "pitstop_queue_depth 0.0" in text
