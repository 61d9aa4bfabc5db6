"""Cluster tests in the store: the last run (one row, so its results outlive the controller) and
each cluster's cable verdicts."""

from __future__ import annotations

from vipu.model.clustertests import CableVerdict, CableVerdicts, Outcome, RunState, Status, TestRun, TestType
from vipu.store.schema import CableVerdictsRow, ClusterTestRunRow
from vipu.store.transactions import TESTS_CHANGED, TransactionBase

LAST_TEST_RUN = "last"


class TestRunRepository(TransactionBase):
    """The last run and the verdicts of each cluster's cables, through the ORM."""

    def get_test_run(self) -> TestRun | None:
        row = self.session.get(ClusterTestRunRow, LAST_TEST_RUN)
        if row is None:
            return None
        outcomes = [
            Outcome(TestType(o["test"]), Status(o["status"]), o["passed"], o["total"], list(o["summary"]), o["duration"],
                    {key: list(lines) for key, lines in o.get("cables", {}).items()},  # runs saved before cables were kept have none
                    tuple(o.get("machines", ())))  # an idle-time test's; none: the whole cluster
            for o in row.outcomes
        ]
        return TestRun(row.cluster_id, RunState(row.state), [TestType(t) for t in row.tests], outcomes)

    def save_test_run(self, run: TestRun) -> None:
        self._changed.add(TESTS_CHANGED)
        row = self.session.get(ClusterTestRunRow, LAST_TEST_RUN)
        if row is None:
            row = ClusterTestRunRow(key=LAST_TEST_RUN)
            self.session.add(row)
        row.cluster_id = run.cluster_id
        row.state = run.state.value
        row.tests = [t.value for t in run.tests]
        row.outcomes = [
            {"test": o.test.value, "status": o.status.value, "passed": o.passed, "total": o.total,
             "summary": list(o.summary), "duration": o.duration, "cables": o.cable_failures, "machines": list(o.machines)}
            for o in run.outcomes
        ]

    def get_cable_verdicts(self, cluster_id: str) -> CableVerdicts | None:
        row = self.session.get(CableVerdictsRow, cluster_id)
        if row is None:
            return None
        return CableVerdicts(RunState(row.run_state),
                             {key: (CableVerdict(cable["verdict"]), tuple(cable["lines"])) for key, cable in row.cables.items()})

    def save_cable_verdicts(self, cluster_id: str, verdicts: CableVerdicts) -> None:
        self._changed.add(TESTS_CHANGED)
        row = self.session.get(CableVerdictsRow, cluster_id)
        if row is None:
            row = CableVerdictsRow(cluster_id=cluster_id)
            self.session.add(row)
        row.run_state = verdicts.run_state.value
        row.cables = {key: {"verdict": verdict.value, "lines": list(lines)} for key, (verdict, lines) in verdicts.cables.items()}
