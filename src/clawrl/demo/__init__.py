"""``clawrl demo``: the personalization experiment (OpenClaw-RL's student / teacher scenarios)
end to end on the embedded model — serve, simulate a user, judge, train, evaluate, report."""

from clawrl.demo.report import score_table, write_report
from clawrl.demo.runner import DemoSettings, MethodResult, run_demo, run_method

__all__ = ["DemoSettings", "MethodResult", "run_demo", "run_method", "score_table", "write_report"]
