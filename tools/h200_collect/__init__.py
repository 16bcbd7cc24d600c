"""Collect real H200 training data: 1 Hz NVML/GPM telemetry while labelled workloads run.

Standalone on the GPU machine (torch, pyarrow, nvidia-ml-py; no wattclass): run it as
``python tools/h200_collect`` (or ``python -m h200_collect`` with ``tools`` on the path).
tests/test_collect_contract.py ties its GPM ids, job-file format and labels to wattclass's own.

Modules: config (environment, constants), context (Ctx/Job/Workload), models (torch.nn
architectures), workloads/ (builders by family; sweep = randomised mechanism sweeps),
catalog (the fixed 66-job table), sampler (NVML/GPM poller), output (probe-format files),
runner (the run loop and ``main``).

Why: the classifier's default model must be trained on real jobs, and the 21 jobs in
wattclass/data/h200/raw are too few. Each workload stands for one job and carries the class it was
built to have (`label`); the GPM rule later gives the truth. Output keeps the probe format
stored in wattclass/data/h200/raw (what the replay backend reads):

  $OUT/<tag>_caps.json           static device facts
  $OUT/<tag>_samples_1hz.parquet every poll; `job` = workload name, `startup`/`gap` when none runs;
                                 since issue 13 round 13 also the HBM's own average power and
                                 temperature (`power_mem_avg_mw`, `mem_temp_c`; null where the GPU
                                 does not answer them; earlier recordings lack both columns)
  $OUT/<tag>_runs.csv            job,label,start,end,steps,rate,unit,energy_j,avg_power_w,
                                 job_id,user,family,params

Setup (allocation, model build, one warm-up step) happens in the gap before a job's timed window,
so a job's recorded interval is its steady work. Partial outputs are rewritten atomically every
~30 s and after each job, so a killed run still leaves usable data.

Read-only towards the GPU's settings: never changes power limits, clocks, persistence, MIG or
NVLink multicast, never resets the device.

Env:
  DUR=13        seconds per workload          GAP=2       minimum seconds between workloads
  PART=k        run workloads with index % PARTS == k (PARTS=2 default)
  ONLY=a,b      run only the named workloads  TAG=name    output prefix (default collect_part<k>)
  LIST=1        print the workload table and exit (needs neither torch nor a GPU)
  SMOKE=1       every workload for 0.3 s with small sizes; prints OK/FAIL per workload
  DEVICE=cpu    local check only: small sizes on the CPU, no NVML sampler
  DEADLINE=s    stop starting workloads that would end after s seconds (default 530; smoke 110;
                0 = none); skipped names are printed as an ONLY= line to run later
  OUT=dir       output directory (default /tmp/out)
  SWEEP=N       N randomised mechanism-sweep runs (workloads/sweep.py) instead of the table; each run
                lasts 8-12 s (its own duration) and runs.csv gets its `family` and `params`
  SEED=s        the sweep plan's seed (same seed = same plan)   FAMILIES=a,b  only these sweep families
  GPU=i         NVML index to sample if CUDA's UUID matches no NVML device (normally the GPU that
                CUDA_VISIBLE_DEVICES selects is found by UUID); one process per GPU, own TAG/JOB_BASE
  LIST=1 with SWEEP=N prints the plan; ONLY=a,b with SWEEP=N runs only those runs of the plan
                (same parameters and job ids as in the full plan)
  RUN_DUR=s     every run lasts s seconds, the sweep runs' own durations too (long re-runs)
"""
