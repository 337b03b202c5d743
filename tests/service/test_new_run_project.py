"""A new run keeps the previous run's project (``transitions.new_run``), for its leftovers to be
found; a project it left behind never holds it."""

from __future__ import annotations

from controller.core.policy import ControllerPolicy
from controller.core.state import Phase
from tests.harness import PROJECT, TRAINER, Harness, spec_doc

OTHER = "old-team-proj"


def test_a_new_run_is_not_held_forever_by_a_project_it_left_and_the_policy_dropped():
    """Run 1 ran (and ended) in OTHER; the admin drops OTHER from the policy and revokes the
    controller's access there; the user resubmits in the default project, which must start."""
    h = Harness(ControllerPolicy(default_project=PROJECT, trainer_service_account=TRAINER,
                                 allowed_projects=(OTHER,)))
    h.submit("j", spec_doc(project=OTHER))
    h.tick()
    h.tick()
    h.exit("j", 0)
    h.tick()
    h.tick()
    assert h.status("j").phase == Phase.SUCCEEDED and h.live("j") == []  # nothing left in OTHER
    h.policy = ControllerPolicy(default_project=PROJECT, trainer_service_account=TRAINER)
    h.compute.failing_projects.add(OTHER)  # 403: the controller's role there was removed
    h.submit("j", spec_doc())  # a new run, in the default project
    for _ in range(4):
        h.tick()
        h.advance(minutes=10)
    st = h.status("j")
    assert h.live("j") == ["j-2"], f"{st.phase} {st.project}: {st.message}"
