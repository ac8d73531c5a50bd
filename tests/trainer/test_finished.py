"""What a trainer that ends by itself says: the key that ended the run and how to train longer (a run that stopped
mid-learning without a word left the user guessing which of a dozen keys to raise)."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

import pytest

from netrl.util import partial
from tests.trainer.test_trainer import Links, make_trainer
from tests.trainer.test_trainer import links as links  # the fixture: a Trainer with no network


def test_a_run_its_epochs_ended_names_trainer_epochs_and_how_to_train_longer(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="netrl.trainer.trainer"):
        make_trainer(tmp_path, epochs=2).run()
    assert re.search(r"trainer finished: trainer\.epochs reached \(2 epochs of 2 rounds x 10 steps: 40 training "
                     r"steps, \d+ env steps arrived\)\. To train longer, raise trainer\.epochs \(--epochs; Python: "
                     r"TrainingOffline\(epochs=\.\.\.\)\), or set it to null to train until stopped, and start the "
                     r"trainer again: it resumes", caplog.text), caplog.text[-2000:]


def test_a_run_total_frames_ended_names_trainer_total_frames_and_how_to_train_longer(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_trainer(tmp_path, epochs=1000)
    trainer.training_cls = partial(trainer.training_cls, total_frames=40)  # packets of 5 samples
    with caplog.at_level(logging.INFO, logger="netrl.trainer.trainer"):
        trainer.run()
    assert re.search(r"trainer finished: trainer\.total_frames reached \(40 env steps arrived from all workers "
                     r"together, of 40\) after \d+ training steps\. To train longer, raise trainer\.total_frames "
                     r"\(--total-frames; Python: TrainingOffline\(total_frames=\.\.\.\)\) and start the trainer "
                     r"again: it resumes", caplog.text), caplog.text[-2000:]
    assert "trainer.epochs reached" not in caplog.text


def test_a_stopped_run_says_nothing_finished(tmp_path: Path, links: type[Links],
                                             caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_trainer(tmp_path, epochs=float("inf"))
    stop = threading.Event()
    links.at = dict.fromkeys(range(1, 10_000), lambda link: stop.set() if link.fetches >= 30 else None)
    with caplog.at_level(logging.INFO, logger="netrl.trainer.trainer"):
        trainer.run(stop)
    assert "finished:" not in caplog.text and "trainer stopped" in caplog.text
