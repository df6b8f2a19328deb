# MLflow's own client over a file store that ember wrote (tests/test_mlflow.cpp): the run's info,
# params, tags, every metric's history and the artifact tree, as one JSON line after "RESULT "
# (values as Python's repr, so that nan and inf survive). Prints SKIPPED when mlflow is missing.
#   python read_mlflow_run.py <mlruns folder> <run id, or @file holding it> <experiment name>
import json, os, pathlib, sys, warnings
warnings.filterwarnings("ignore")
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 keeps the file store behind this switch
try:
    from mlflow.tracking import MlflowClient
except Exception as e:  # noqa: BLE001
    print("SKIPPED: mlflow is not importable: %s" % e)
    sys.exit(0)
root, run_id, name = sys.argv[1], sys.argv[2], sys.argv[3]
if run_id.startswith("@"):  # the file a Trainer writes: <log_dir>/mlflow_run_id
    run_id = pathlib.Path(run_id[1:]).read_text().strip()
c = MlflowClient(tracking_uri=pathlib.Path(root).resolve().as_uri())
exp = c.get_experiment_by_name(name)
run = c.get_run(run_id)
def walk(path=None):
    out = []
    for f in c.list_artifacts(run_id, path):
        out.append(f.path + ("/" if f.is_dir else ""))
        if f.is_dir:
            out += walk(f.path)
    return out
hist = {k: [[m.step, repr(m.value), m.timestamp] for m in c.get_metric_history(run_id, k)] for k in run.data.metrics}
print("RESULT " + json.dumps({
    "experiment_id": exp.experiment_id if exp else None,
    "experiments": sorted(e.name for e in c.search_experiments()),
    "status": run.info.status, "run_name": run.info.run_name, "run_experiment": run.info.experiment_id,
    "end_time": run.info.end_time, "params": run.data.params, "tags": run.data.tags,
    "metrics": hist, "artifacts": sorted(walk()),
    "runs": [r.info.run_id for r in c.search_runs([run.info.experiment_id])]}))
