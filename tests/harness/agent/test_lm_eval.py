"""lm-eval-style task YAML over local JSONL/Parquet: prompt template, generate_until, regex filter, exact_match."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from polar.config.llm_agent import LmEvalTasks
from polar.errors import ConfigError
from polar.harness.benchmarks import lm_eval
from polar.harness.benchmarks.sources import load_run_tasks

TASK = """
task: tiny_gsm
dataset_path: json
dataset_kwargs: {data_files: {test: data/test.jsonl}}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: "{{answer.split('#### ')[-1]}}"
generation_kwargs: {until: ["Question:", "\\n\\n"], max_gen_toks: 40, do_sample: false}
metric_list:
  - {metric: exact_match, aggregation: mean, higher_is_better: true, ignore_case: true, ignore_punctuation: false,
     regexes_to_ignore: [",", "\\\\$"]}
filter_list:
  - name: strict-match
    filter:
      - {function: regex, regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"}
      - {function: take_first}
"""


def _write(tmp_path, task=TASK):
    (tmp_path / "data").mkdir(exist_ok=True)
    docs = [{"question": "What is 2 + 2?", "answer": "2 + 2 = 4\\n#### 4"},
            {"question": "What is 1,000 + 1?", "answer": "#### 1,001"}]
    (tmp_path / "data" / "test.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "task.yaml").write_text(task)
    return LmEvalTasks(task="task.yaml")


def test_a_task_yaml_becomes_tasks_with_its_template_and_stop_sequences(tmp_path):
    tasks = load_run_tasks(_write(tmp_path), tmp_path)
    assert [t["prompt"] for t in tasks] == ["Question: What is 2 + 2?\nAnswer:", "Question: What is 1,000 + 1?\nAnswer:"]
    assert [t["answer"] for t in tasks] == ["4", "1,001"]
    assert tasks[0]["stop"] == ["Question:", "\n\n"] and tasks[0]["max_tokens"] == 40


def test_regex_filter_then_exact_match(tmp_path):
    tasks = load_run_tasks(_write(tmp_path), tmp_path)
    assert lm_eval.verify(tasks[0], "2 and 2 make 4.\n#### 4")["reward"] == 1.0
    assert lm_eval.verify(tasks[0], "#### 5")["reward"] == 0.0
    miss = lm_eval.verify(tasks[0], "it is 4")
    assert miss["reward"] == 0.0 and miss["filtered"] == "[invalid]"
    assert lm_eval.verify(tasks[1], "#### 1001")["reward"] == 1.0  # regexes_to_ignore drops the comma


def test_parquet_folder_and_bad_task_files(tmp_path):
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"text": ["Say hi"], "target": ["hi"]}), tmp_path / "pq" / "test.parquet")
    (tmp_path / "p.yaml").write_text("task: p\ndataset_path: pq\ntest_split: test\noutput_type: generate_until\n")
    tasks = load_run_tasks(LmEvalTasks(task="p.yaml"), tmp_path)
    assert tasks[0]["prompt"] == "Say hi" and lm_eval.verify(tasks[0], "hi")["reward"] == 1.0
    cases = {
        "dataset_path: gsm8k\ntest_split: test\n": "not a local file",
        "dataset_path: pq\ntest_split: test\noutput_type: loglikelihood\n": "only generate_until",
        "dataset_path: pq\ntest_split: test\nmetric_list: [{metric: bleu}]\n": "only exact_match",
        "dataset_path: pq\ntest_split: test\ndoc_to_txt: x\n": "unknown lm-eval task key 'doc_to_txt'",
        "dataset_path: pq\ntest_split: test\nfilter_list: [{name: f, filter: [{function: majority_vote}]}]\n":
            "majority_vote",
    }
    for body, message in cases.items():
        (tmp_path / "bad.yaml").write_text(body)
        with pytest.raises(ConfigError, match=message):
            load_run_tasks(LmEvalTasks(task="bad.yaml"), tmp_path)
