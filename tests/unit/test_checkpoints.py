"""Checkpoint discovery: the newest *complete* checkpoint of every supported format."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from controller.core.checkpoints import CustomRule, latest, rule_problem, split_uri, temporary
from controller.core.ports import BlobInfo
from tests import checkpoint_trees as trees

URI = "gs://ck/runs/a"
T = datetime(2026, 1, 1, tzinfo=UTC)


def find(names: list[str], contents: dict[str, str] | None = None, fmt: str = "auto"):
    listing = [BlobInfo("ck", f"runs/a/{n}", i + 1, T) for i, n in enumerate(names)]
    # noise outside the prefix must be ignored
    listing.append(BlobInfo("ck", "runs/ab/999/commit_success.txt", 999, T))
    contents = contents or {}
    return latest(URI, listing, lambda rel, limit: contents.get(rel, "").encode()[:limit] or None, fmt)


@pytest.mark.parametrize(
    "names, uri, step, fmt",
    [
        # orbax: a step directory counts only with commit_success
        (["100/state/a", "100/commit_success.txt", "200/state/a"], "gs://ck/runs/a/100", 100, "orbax"),
        (["100/commit_success.txt", "200/commit_success.txt"], "gs://ck/runs/a/200", 200, "orbax"),
        (["100/commit_success.txt", "300.orbax-checkpoint-tmp-12/commit_success.txt"], "gs://ck/runs/a/100", 100, "orbax"),
        # torch.distributed.checkpoint: .metadata is written last
        (["step_5/__0_0.distcp", "step_5/.metadata", "step_9/__0_0.distcp"], "gs://ck/runs/a/step_5", 5, "dcp"),
        # numbered plain files are single objects: complete when visible
        (["ckpt-000120.pt", "ckpt-000080.pt", "notes.txt"], "gs://ck/runs/a/ckpt-000120.pt", 120, "files"),
        # numbered directories need a marker; HF's trainer_state.json is one
        (["checkpoint-50/model.bin", "checkpoint-50/trainer_state.json", "checkpoint-60/model.bin"],
         "gs://ck/runs/a/checkpoint-50", 50, "huggingface"),
        (["step_120/_SUCCESS", "step_130/part-0"], "gs://ck/runs/a/step_120", 120, "files"),
        # TensorFlow without the state file: the .index proves a prefix complete
        (["ckpt-7.index", "ckpt-7.data-00000-of-00001", "ckpt-8.data-00000-of-00001"], "gs://ck/runs/a/ckpt-7", 7, "tensorflow"),
        # Lightning's last.ckpt wins over numbered files
        (["epoch=3-step=1200.ckpt", "last.ckpt"], "gs://ck/runs/a/last.ckpt", None, "lightning"),
    ],
)
def test_chooses_newest_complete(names, uri, step, fmt):
    found = find(names)
    assert found is not None
    assert (found.uri, found.step, found.format) == (uri, step, fmt)


@pytest.mark.parametrize(
    "names",
    [
        [],
        ["100/state/a"],  # orbax step without commit_success
        ["step_5/__0_0.distcp"],  # DCP without .metadata
        ["step_130/part-0"],  # numbered directory without a marker
        ["ckpt-8.data-00000-of-00001"],  # TF data without index
    ],
)
def test_never_chooses_a_partial_checkpoint(names):
    assert find(names) is None


def test_latest_pointer_is_trusted_when_its_target_exists():
    found = find(["100/commit_success.txt", "200/x", "LATEST"], {"LATEST": "200"})
    assert found and (found.uri, found.step, found.format) == ("gs://ck/runs/a/200", 200, "pointer")


def test_latest_pointer_accepts_a_full_uri():
    found = find(["200/x", "LATEST"], {"LATEST": "gs://ck/runs/a/200\n"})
    assert found and found.uri == "gs://ck/runs/a/200"


def test_latest_pointer_to_nothing_falls_back_to_the_listing():
    found = find(["100/commit_success.txt", "LATEST"], {"LATEST": "999"})
    assert found and found.uri == "gs://ck/runs/a/100"


def test_tensorflow_state_file_names_the_latest():
    names = ["ckpt-7.index", "ckpt-9.index", "checkpoint"]
    found = find(names, {"checkpoint": 'model_checkpoint_path: "ckpt-7"\nall_model_checkpoint_paths: "ckpt-7"'})
    assert found and (found.uri, found.step) == ("gs://ck/runs/a/ckpt-7", 7)


def test_tensorflow_state_file_pointing_at_partial_save_is_ignored():
    found = find(["ckpt-7.index", "ckpt-9.data-0", "checkpoint"], {"checkpoint": 'model_checkpoint_path: "ckpt-9"'})
    assert found and found.uri == "gs://ck/runs/a/ckpt-7"


def test_explicit_format_restricts_detection():
    names = ["100/commit_success.txt", "ckpt-000500.pt"]
    assert find(names, fmt="orbax").uri == "gs://ck/runs/a/100"
    assert find(names, fmt="files").uri == "gs://ck/runs/a/ckpt-000500.pt"
    assert find(names, fmt="dcp") is None


def test_version_moves_when_the_same_file_is_rewritten():
    listing1 = [BlobInfo("ck", "runs/a/last.ckpt", 1, T)]
    listing2 = [BlobInfo("ck", "runs/a/last.ckpt", 2, T)]
    a = latest(URI, listing1, lambda *_: None)
    b = latest(URI, listing2, lambda *_: None)
    assert a and b and a.uri == b.uri and a.version != b.version


def test_split_uri():
    assert split_uri("gs://b/x/y/") == ("b", "x/y/")
    assert split_uri("gs://b") == ("b", "")


# -- the checkpoints LLM frameworks write ---------------------------------------------------


def discover_tree(tree: trees.Tree, fmt: str | None = None, drop: tuple[str, ...] = ()):
    """Discovery over a tree as GCS would list it: a rewritten object keeps its last generation."""
    objects = {name: (i + 1, data) for i, (name, data) in enumerate(tree.objects) if name not in drop}
    listing = [BlobInfo("ck", f"runs/a/{n}", gen, T, len(data)) for n, (gen, data) in objects.items()]
    read = lambda rel, limit: (d := objects.get(rel, (0, b""))[1]) and (d if len(d) <= limit else None)  # noqa: E731
    spec = tree.checkpoint
    rule = CustomRule(spec["pattern"], spec.get("marker"), spec.get("same_files", False)) if "pattern" in spec else None
    return latest(URI, listing, read, fmt or spec.get("format", "auto"), rule)


@pytest.mark.parametrize("make", trees.ALL, ids=lambda m: m.__name__)
def test_llm_framework_trees_resume_from_the_newest_complete_save(make):
    tree = make()
    found = discover_tree(tree)
    assert found is not None
    assert (found.uri, found.step, found.tag, found.label) == \
        (f"{URI}/{tree.expected}", tree.step, tree.tag, tree.label)


@pytest.mark.parametrize("make, fmt", [(trees.deepspeed, "deepspeed"), (trees.megatron_legacy, "megatron"),
                                       (trees.megatron_torch_dist, "megatron"), (trees.accelerate, "accelerate"),
                                       (trees.huggingface, "huggingface"), (trees.huggingface, "files"),
                                       (trees.torch_files, "files")])
def test_each_framework_is_found_by_its_own_format_name_too(make, fmt):
    tree = make()
    found = discover_tree(tree, fmt)
    assert found and found.uri == f"{URI}/{tree.expected}"
    assert discover_tree(tree, "orbax") is None  # and not by another's


def test_text_order_and_number_order_disagree_in_every_numbered_tree():
    """The trees themselves: an older complete save sorts after the expected one as text."""
    import re

    for make in trees.ALL:
        tree = make()
        if tree.tag is not None:
            continue  # a tracker names the save: no numbers are compared
        depth = tree.expected.count("/") + 1
        saves = {"/".join(n.split("/")[:depth]) for n, _ in tree.objects if n.count("/") >= depth - 1}
        number = lambda name: int(re.findall(r"\d+", name)[-1])  # noqa: E731
        older_but_larger_text = [s for s in saves if number(s) < number(tree.expected) and s > tree.expected]
        assert older_but_larger_text, tree.name
        assert max(saves, key=number) != tree.expected, f"{tree.name}: its newest save must be partial"


def test_deepspeed_without_its_tracker_has_nothing_complete():
    tree = trees.deepspeed()
    assert discover_tree(tree, drop=("latest",)) is None


def test_deepspeed_tracker_naming_a_deleted_or_hostile_tag_is_not_trusted():
    objects = {"global_step5/mp_rank_00_model_states.pt": 1, "latest": 2}
    listing = [BlobInfo("ck", f"runs/a/{n}", g, T) for n, g in objects.items()]
    for tag in (b"global_step9", b"../other/global_step5", b"global_step5/../..", b"", b"\x00" * 10):
        assert latest(URI, listing, lambda rel, limit, t=tag: t) is None
    found = latest(URI, listing, lambda rel, limit: b"global_step5\n")
    assert found and found.tag == "global_step5" and found.step == 5


def test_megatron_release_and_a_garbled_tracker():
    listing = [BlobInfo("ck", "runs/a/release/mp_rank_00/model_optim_rng.pt", 1, T),
               BlobInfo("ck", "runs/a/latest_checkpointed_iteration.txt", 2, T)]
    found = latest(URI, listing, lambda rel, limit: b"release")
    assert found and (found.uri, found.step, found.tag, found.label) == (f"{URI}/release", None, "release", "release")
    for garbage in (b"-5", b"12abc", b"\xff\xfe", b"1" * 40, b"\xd9\xa3"):  # the last: an Arabic-Indic digit
        assert latest(URI, listing, lambda rel, limit, g=garbage: g, "megatron") is None


def test_megatron_iteration_past_seven_digits():
    listing = [BlobInfo("ck", "runs/a/iter_12345678/mp_rank_00/model_optim_rng.pt", 1, T),
               BlobInfo("ck", "runs/a/latest_checkpointed_iteration.txt", 2, T)]
    found = latest(URI, listing, lambda rel, limit: b"12345678")
    assert found and found.uri == f"{URI}/iter_12345678" and found.tag == "12345678"


def _accelerate(saves: dict[int, list[str]]):
    names = [f"checkpoints/checkpoint_{i}/{f}" for i, files in saves.items() for f in files]
    listing = [BlobInfo("ck", f"runs/a/{n}", g + 1, T) for g, n in enumerate(names)]
    return latest(URI, listing, lambda *_: None, "accelerate")


FULL = ["model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl", "random_states_1.pkl"]


@pytest.mark.parametrize("partial", [
    ["model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl"],  # no scheduler
    ["model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"],  # rank 1 still writing
    ["random_states_1.pkl", "random_states_0.pkl"],  # ranks first, the main process's model not yet
    ["model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_1.pkl"],  # rank 0 not yet
])
def test_accelerate_partial_newest_save_is_skipped(partial):
    found = _accelerate({9: FULL, 10: FULL, 11: partial})
    assert found and found.uri.endswith("/checkpoint_10") and found.label == "save 10" and found.step is None


def test_accelerate_first_save_alone_and_a_gap_in_its_ranks():
    assert _accelerate({0: FULL}).uri.endswith("/checkpoint_0")
    assert _accelerate({0: ["model.safetensors", "random_states_0.pkl", "random_states_2.pkl"]}) is None
    assert _accelerate({0: ["optimizer.bin", "random_states_0.pkl"]}) is None  # no model at all


def test_accelerate_more_files_later_is_fine_but_a_repeated_partial_shape_never_confirms_itself():
    assert _accelerate({1: FULL, 2: [*FULL, "custom_checkpoint_0.pkl"]}).uri.endswith("/checkpoint_2")
    # the same rank cut off twice, two saves in a row: still partial, both times
    cut = FULL[:-1]
    assert _accelerate({1: FULL, 2: cut, 3: cut}).uri.endswith("/checkpoint_1")
    assert _accelerate({0: FULL, 1: cut, 2: FULL, 3: cut}).uri.endswith("/checkpoint_2")
    # the documented price: after the world shrank (8 processes, then 4), the smaller saves never count
    eight = ["model.safetensors", "optimizer.bin", "scheduler.bin", *(f"random_states_{r}.pkl" for r in range(8))]
    assert _accelerate({1: eight, 2: eight[:7], 3: eight[:7]}).uri.endswith("/checkpoint_1")


def test_accelerate_with_names_of_its_own():
    def named(saves: dict[str, list[str]]):
        listing = [BlobInfo("ck", f"runs/a/{d}/{f}", i + 1, T) for i, (d, f) in
                   enumerate((d, f) for d, files in saves.items() for f in files)]
        return latest(URI, listing, lambda *_: None)

    found = named({"step_900": FULL, "step_1000": FULL, "step_1100": FULL[:-1]})
    assert found and (found.uri, found.step, found.label) == (f"{URI}/step_1000", 1000, "step 1000")
    found = named({"epoch_9": FULL, "epoch_10": FULL})
    assert found and (found.uri, found.step, found.label) == (f"{URI}/epoch_10", None, "epoch_10")


def test_accelerate_saves_directly_under_the_prefix_too():
    listing = [BlobInfo("ck", f"runs/a/checkpoint_3/{f}", i + 1, T) for i, f in enumerate(FULL)]
    found = latest(URI, listing, lambda *_: None)
    assert found and found.uri == f"{URI}/checkpoint_3" and found.format == "accelerate"


def test_huggingface_step_comes_from_trainer_state_and_survives_a_bad_one():
    def hf(state: bytes, size: int | None = None):
        listing = [BlobInfo("ck", "runs/a/epoch-3/model.safetensors", 1, T),
                   BlobInfo("ck", "runs/a/epoch-3/trainer_state.json", 2, T, size if size is not None else len(state))]
        return latest(URI, listing, lambda rel, limit: state if len(state) <= limit else None)

    assert hf(json.dumps({"global_step": 1200, "log_history": []}).encode()).step == 1200
    for bad in (b"{", b"[]", b'{"global_step": "1200"}', b'{"global_step": true}', b'{"global_step": -1}',
                b'{"global_step": 1e400}'):
        assert hf(bad).step == 3, bad  # the directory's own number
    assert hf(b'{"global_step": 1200}', size=50 * 1024 * 1024).step == 3  # too large to read: not read


@pytest.mark.parametrize("name, expected", [
    ("ckpt_1000.pt.tmp", True), ("ckpt_1000.tmp.pt", True), ("ckpt.pt.partial", True), ("tmpk3j2.pt", True),
    (".ckpt_1000.pt", True), ("step_5-incomplete", True), ("300.orbax-checkpoint-tmp-12", True),
    ("ckpt_1000.pt", False), ("checkpoint-50", False), ("model_part3.pt", False), ("temperature_10.pt", False),
    ("step_120", False),
])
def test_temporary_names(name, expected):
    assert temporary(name) is expected


def test_numbered_directory_with_a_temporary_name_is_never_chosen():
    listing = [BlobInfo("ck", "runs/a/step_100/_SUCCESS", 1, T), BlobInfo("ck", "runs/a/step_200.tmp/_SUCCESS", 2, T)]
    assert latest(URI, listing, lambda *_: None).uri == f"{URI}/step_100"


def _custom(rule: CustomRule, names: list[str]):
    listing = [BlobInfo("ck", f"runs/a/{n}", i + 1, T) for i, n in enumerate(names)]
    return latest(URI, listing, lambda *_: None, "custom", rule)


def test_custom_file_pattern_and_nested_directories():
    rule = CustomRule("weights/w-{step}.bin")
    found = _custom(rule, ["weights/w-90.bin", "weights/w-100.bin", "weights/w-110.bin.tmp", "weights/x-200.bin"])
    assert found and found.uri == f"{URI}/weights/w-100.bin" and found.step == 100
    nested = CustomRule("exp/{step}/state/", marker="meta/DONE")
    found = _custom(nested, ["exp/90/state/a", "exp/90/state/meta/DONE", "exp/100/state/a", "exp/100/other/DONE"])
    assert found and found.uri == f"{URI}/exp/90/state"


def test_custom_same_files_trusts_the_first_save_only_once_the_trainer_moved_on():
    rule = CustomRule("s{step}/", same_files=True)
    assert _custom(rule, ["s10/a", "s10/b"]) is None  # nothing to compare it with yet
    assert _custom(rule, ["s10/a", "s10/b", "s20/a"]).uri == f"{URI}/s10"
    assert _custom(rule, ["s10/a", "s10/b", "s20/a", "s20/b"]).uri == f"{URI}/s20"


@pytest.mark.parametrize("pattern, marker, same, field", [
    (None, None, False, "pattern"),
    ("run/step/", "DONE", False, "pattern"),  # no {step}
    ("run/{step}/{step}/", "DONE", False, "pattern"),
    ("run/{stp}/", "DONE", False, "pattern"),
    ("run/v2{step}/", "DONE", False, "pattern"),  # touches a digit
    ("/abs/{step}/", "DONE", False, "pattern"),
    ("a/../{step}/", "DONE", False, "pattern"),
    ("a//{step}/", "DONE", False, "pattern"),
    ("step_{step}//", "DONE", False, "pattern"),
    ("a/{step}/*", None, False, "pattern"),
    ("a/{step}/", None, False, "marker"),  # a directory needs a rule
    ("a/{step}/", "DONE", True, "marker"),  # not both
    ("a/{step}/", "../DONE", False, "marker"),
    ("a-{step}.pt", "DONE", False, "marker"),  # a single object needs no marker
    ("a-{step}.pt", None, True, "same_files"),
])
def test_invalid_custom_rules_name_their_field(pattern, marker, same, field):
    problem = rule_problem(pattern, marker, same)
    assert problem and problem[0] == field


def test_valid_custom_rules():
    assert rule_problem("run/step-{step}/", "COMMITTED", False) is None
    assert rule_problem("run/step-{step}/", None, True) is None
    assert rule_problem("ckpt-{step}.pt", None, False) is None


def test_deepspeed_tag_whose_other_ranks_are_still_writing_falls_back_to_the_save_before():
    """Rank 0 writes ``latest`` without a barrier: the tagged save may lack another rank's files."""
    def save(step: int, ranks: int) -> list[str]:
        return [f"global_step{step}/mp_rank_00_model_states.pt",
                *(f"global_step{step}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ranks))]

    names = [*save(5, 4), *save(15, 4), *save(20, 2), "latest"]
    listing = [BlobInfo("ck", f"runs/a/{n}", i + 1, T) for i, n in enumerate(names)]
    found = latest(URI, listing, lambda rel, limit: b"global_step20")
    assert found and (found.uri, found.tag, found.step) == (f"{URI}/global_step15", "global_step15", 15)
    whole = [*save(5, 4), *save(15, 4), *save(20, 4), "latest"]
    listing = [BlobInfo("ck", f"runs/a/{n}", i + 1, T) for i, n in enumerate(whole)]
    assert latest(URI, listing, lambda rel, limit: b"global_step20").tag == "global_step20"
    # a tag of the user's own, with no number, is taken as named
    listing = [BlobInfo("ck", "runs/a/best/mp_rank_00_model_states.pt", 1, T), BlobInfo("ck", "runs/a/latest", 2, T)]
    assert latest(URI, listing, lambda rel, limit: b"best").tag == "best"


def test_deepspeed_partial_saves_left_by_earlier_attempts_never_vouch_for_a_partial_tag():
    """Saves cut off on SIGTERM stay behind: the tag is checked against the last *complete* save."""
    def save(step: int, ranks: int) -> list[str]:
        return [f"global_step{step}/mp_rank_00_model_states.pt",
                *(f"global_step{step}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ranks))]

    for names in ([*save(10, 2), *save(17, 1), *save(19, 1)], [*save(10, 3), *save(17, 2), *save(20, 1)]):
        tag = names[-1].split("/")[0]
        listing = [BlobInfo("ck", f"runs/a/{n}", i + 1, T) for i, n in enumerate([*names, "latest"])]
        found = latest(URI, listing, lambda rel, limit, t=tag: t.encode())
        assert found and found.tag == "global_step10", (tag, found)
    only = [*save(10, 2)]
    listing = [BlobInfo("ck", f"runs/a/{n}", i + 1, T) for i, n in enumerate([*only, "latest"])]
    assert latest(URI, listing, lambda rel, limit: b"global_step10").tag == "global_step10"  # as DeepSpeed would


def test_megatron_directories_count_only_through_the_tracker():
    listing = [BlobInfo("ck", f"runs/a/iter_0000100/{f}", i + 1, T)
               for i, f in enumerate(["common.pt", "__0_0.distcp", ".metadata"])]
    assert latest(URI, listing, lambda *_: None) is None  # no tracker yet: not DCP's to claim


def test_nemo_unfinished_marker_and_the_step_a_name_says():
    name = "megatron_gpt--val_loss=2.10-step=3000-consumed_samples=24000.0"
    older = "megatron_gpt--val_loss=2.30-step=2000-consumed_samples=16000.0"
    listing = [BlobInfo("ck", f"runs/a/{older}/.metadata", 1, T), BlobInfo("ck", f"runs/a/{name}/.metadata", 2, T),
               BlobInfo("ck", f"runs/a/{name}-unfinished", 3, T)]
    found = latest(URI, listing, lambda *_: None)
    assert found and found.uri == f"{URI}/{older}" and found.step == 2000
    assert latest(URI, listing[:2], lambda *_: None).step == 3000


def test_hostile_numbers_are_no_steps():
    listing = [BlobInfo("ck", "runs/a/ckpt_100.pt", 1, T), BlobInfo("ck", f"runs/a/ckpt_{'9' * 1000}.pt", 2, T),
               BlobInfo("ck", "runs/a/ckpt_\u0661\u0662\u0663.pt", 3, T)]
    found = latest(URI, listing, lambda *_: None)
    assert found and found.uri == f"{URI}/ckpt_100.pt"


def test_deeply_nested_trainer_state_is_survived():
    listing = [BlobInfo("ck", "runs/a/checkpoint-7/trainer_state.json", 1, T, 200_000)]
    found = latest(URI, listing, lambda rel, limit: b"[" * 200_000)
    assert found and found.step == 7


@pytest.mark.parametrize("save, fmt, rule", [
    ([f"checkpoint_3/{f}" for f in FULL], "accelerate", None),
    ([f"checkpoints/checkpoint_3/{f}" for f in FULL], "accelerate", None),
    (["step-3/model.bin", "step-3/_SUCCESS"], "files", None),
    (["step-3/__0_0.distcp", "step-3/.metadata"], "dcp", None),
    (["step-3/w.bin", "step-3/DONE"], "custom", CustomRule("step-{step}/", marker="DONE")),
    (["exp/3/state/w.bin", "exp/3/state/meta/DONE"], "custom", CustomRule("exp/{step}/state/", marker="meta/DONE")),
    (["step-3/w.bin"], "custom", CustomRule("step-{step}/", same_files=True)),
])
def test_a_save_with_an_unfinished_object_beside_it_is_never_complete_in_any_format(save, fmt, rule):
    # respawnkit writes "<save>-unfinished" before a save's first object and removes it after its last: whatever
    # the save holds meanwhile, and whichever rule reads it, it must not count (Accelerate's and the custom rules
    # counted it, only the numbered markers honoured NeMo's "-unfinished")
    directory = save[0].rsplit("/", 1)[0]
    older = [n.replace("3", "2", 1) for n in save]  # a whole save before it, of the same shape
    listing = [BlobInfo("ck", f"runs/a/{n}", i + 1, T) for i, n in enumerate([*older, *save])]
    whole = latest(URI, listing, lambda *_: None, fmt, rule)
    assert whole and whole.uri == f"{URI}/{directory}"
    hidden = [*listing, BlobInfo("ck", f"runs/a/{directory}-unfinished", 99, T)]
    for f in ("auto", fmt):
        found = latest(URI, hidden, lambda *_: None, f, rule)
        assert found is None or found.uri == f"{URI}/{directory.replace('3', '2', 1)}", (f, found)
