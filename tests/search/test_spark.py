"""DIMR trials on hyperopt's distributed backend (SparkTrials on a local Spark).

Needs pyspark (`pip install pyspark`) and a Java runtime; slow (a Spark start and one Spark job
per trial), so it runs with `pytest -m slow`.
"""

import os
import shutil
import sys

import pytest

from tests.search.test_search import WEIGHTS, AdditiveObjective
from viasd_adapters.search import Budget, MaskSpace, SearchConfig, run_search

pytestmark = pytest.mark.slow


def test_search_on_spark_trials():
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("SparkTrials needs a Java runtime")
    from hyperopt import SparkTrials
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import viasd_adapters from this venv
    spark = (
        SparkSession.builder.master("local[2]").appName("dimr-test").config("spark.ui.enabled", "false").getOrCreate()
    )
    try:
        space = MaskSpace(8, Budget("layers", 2))
        trials = SparkTrials(parallelism=2, spark_session=spark)
        result = run_search(
            AdditiveObjective(WEIGHTS), space, SearchConfig(num_random=4, num_tpe=4), trials=trials, progress=False
        )
    finally:
        spark.stop()
    assert len(result.trials) == 8
    assert result.best.mask.skip_layers == (3, 4)  # the cheapest pair of this additive objective
