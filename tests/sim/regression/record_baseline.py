"""Record the simulator regression fixture: simulate every workload of regression_workloads.py
and write their metrics as JSON to the path given (see test_step_regression.py)."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from regression_workloads import WORKLOADS, metrics_of

from ccoverlap.predict.evaluate import simulate_workload
from ccoverlap.predict.workload import workload_from_mapping

out = {}
for name, data in WORKLOADS.items():
    w = workload_from_mapping(data, source=name)
    t0 = time.perf_counter()
    step, tl = simulate_workload(w)
    out[name] = metrics_of(step, tl)
    print(f"{name:32s} {out[name]['ops']:7d} ops {out[name]['step_time_s']*1e3:10.3f} ms  {time.perf_counter()-t0:.2f}s", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1, sort_keys=True)
