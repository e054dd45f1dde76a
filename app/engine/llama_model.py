"""One loaded GGUF: the llama.cpp model, its generation context and batch scheduler, its
embedding context, and the card the API reports. Opened and freed on the engine thread.

The engine (app.engine.llama_engine) loads one at start-up and again after each idle sleep;
this module is what a load is: check the file, place the layers (GPU_LAYERS, SPLIT_MODE,
TENSOR_SPLIT, MAIN_GPU, CPU_EXTRA_BUFFERS), open the contexts, read the metadata.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable

from app.base import cxx_runtime
from app.base.errors import ModelLoadError
from app.engine import cpu_buffers, cuda_check, llama_log, memory_check, mtp, placement
from app.engine.config import EngineConfig, n_threads
from app.engine.deterministic import Canon
from app.engine.embed import POOLING_IDS
from app.engine.file_holds import FileHolds
from app.engine.llama_embed import (
    DEFAULT_MAX_CTX,
    GENERATIVE_MAX_CTX,
    DecodeTurns,
    EmbedConfig,
    LlamaEmbedder,
    open_context,
)
from app.engine.llama_media import Projector
from app.engine.llama_vocab import Tokenizer, vocab_type_name
from app.engine.lora import AdapterFile, Adapters
from app.engine.prompt_cache import PromptCache
from app.engine.sampling import Vocab
from app.engine.scheduler import Features, Scheduler
from app.engine.slots import Job
from app.engine.speculative import DraftModel, SpecConfig
from app.engine.types import ModelInfo

log = logging.getLogger(__name__)

FLASH = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type
_SPLIT = {"none": 0, "layer": 1, "row": 2}  # llama_split_mode


class LlamaModel:
    """A loaded model and everything opened on it. ``sched`` is None for an embedding-only
    model (no generation context); ``embedder`` is None when EMBEDDINGS is off."""

    def __init__(self, ll, cfg: EngineConfig, stage: Callable[..., None]):
        self.ll = ll
        self.cfg = cfg
        self._stage = stage  # the load stage health reports (progress while loading)
        self.model = None
        self.ctx = None
        self.mem = None
        self.batch = None
        self.sched: Scheduler | None = None
        self.embedder: LlamaEmbedder | None = None
        self.generates = True
        self.n_ctx = 0  # tokens one sequence may hold
        self.n_vocab = 0
        self.max_prompt_bytes = 0  # a prompt longer than this in bytes cannot fit
        self.gpu_layers = 0
        self.extra_buffers = False
        self.system_info = ""
        self.cuda: dict | None = None  # what a CUDA build found (cuda_check), None otherwise
        self.projector: Projector | None = None  # MMPROJ, when set
        self.draft_model: DraftModel | None = None  # DRAFT_MODEL, when set
        self.mtp: mtp.MtpDrafter | None = None  # SPEC_MTP, where the model has the layers
        self.adapters: Adapters | None = None  # LORA_ADAPTERS, when set
        # KV_CACHE_TYPE_*, N_UBATCH and the tensor overrides as loaded: /props "placement"
        self.placement: dict = {}
        self._kv_mib = 0.0  # the generation context's KV cache, as llama.cpp's log gave it
        self.memory: dict | None = None  # the memory check's verdict and what was allocated
        self._verdict: memory_check.Verdict | None = None
        # shared locks on the files llama.cpp opens, from load to free: the bounded download
        # cache (MODEL_CACHE_MAX_GB) never deletes a file in use (app.engine.file_holds)
        self._holds = FileHolds()

    # ---- open ------------------------------------------------------------------------------
    def load(self, path: str, turns: DecodeTurns, job_over: Callable[[Job], None],
             mmproj: str | None = None, draft: str | None = None,
             adapters: list[AdapterFile] | None = None) -> None:
        """Open ``path``: the model, then the generation context (unless embedding-only), then
        the embedding context (when EMBEDDINGS asks for one). Raises ModelLoadError."""
        ll, cfg = self.ll, self.cfg
        llama_log.install(ll, cfg.verbose)  # placement lines always; the rest with debug
        if not os.path.isfile(path):
            raise ModelLoadError(f"model {path}: file not found")
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise ModelLoadError(f"model {path}: not a GGUF file (bad magic)")
        self._holds.hold_all([path, mmproj, draft, *(a.path for a in adapters or [])])
        ll.llama_backend_init()

        self._stage("loading", progress=0.0, detail=os.path.basename(path))
        mparams = ll.llama_model_default_params()
        gpu = ll.llama_supports_gpu_offload()
        mparams.n_gpu_layers = (-1 if cfg.gpu_layers < 0 else cfg.gpu_layers) if gpu else 0
        self.gpu_layers = mparams.n_gpu_layers
        self._split_params(mparams)
        chosen = placement.rules(cfg.override_tensor, cfg.cpu_moe, cfg.n_cpu_moe)
        if chosen:
            self._overrides = placement.Overrides(ll, chosen)  # alive while loading
            mparams.tensor_buft_overrides = self._overrides.pointer
        self.system_info = ll.llama_print_system_info().decode("utf-8", "replace").strip()
        extra, why = cpu_buffers.resolve(cfg.cpu_extra_buffers, self.system_info)
        if not extra and cfg.cpu_extra_buffers == "auto":
            log.warning("%s", why)
        mparams.use_extra_bufts = self.extra_buffers = extra
        if "CUDA :" in self.system_info:  # a CUDA build: say what it found, and what is wrong
            report = cuda_check.probe(self.system_info)
            log.info("%s", report.line())
            for problem in report.problems():
                log.warning("%s", problem)
            self.cuda = report.as_dict()

        # before llama.cpp allocates anything: will it fit? (MEMORY_CHECK=error refuses here)
        self._verdict = memory_check.run(ll, cfg, path, mmproj, draft, adapters or [], gpu)

        def on_progress(progress: float, _user: ctypes.c_void_p) -> bool:
            self._stage("loading", progress=float(progress))
            return True

        self._progress_cb = ll.llama_progress_callback(on_progress)  # alive while loading
        mparams.progress_callback = self._progress_cb
        # the MTP layers are loaded only to be used (their weights cost memory)
        # DETERMINISTIC decodes one token per step: no drafts (SPEC_MTP=on with it is refused)
        use_mtp = cfg.embeddings != "only" and not cfg.deterministic \
            and mtp.wanted(cfg.spec_mtp, path, draft)
        if use_mtp:
            mparams.load_mtp = True
        model = ll.llama_model_load_from_file(path.encode(), mparams)
        if not model:
            raise ModelLoadError(
                f"model {path}: llama.cpp could not load it (corrupt or unsupported file, "
                "or not enough memory)"
            )
        self.model = model
        self.vocab = ll.llama_model_get_vocab(model)
        self.vocab_tables = Vocab(ll, self.vocab)
        self.tok = Tokenizer(ll, self.vocab, cfg.preserved_tokens,
                             self.vocab_tables.user_defined_texts)
        self.n_ctx_train = ll.llama_model_n_ctx_train(model)
        self.n_threads = n_threads(cfg)
        self.n_threads_batch = cfg.threads_batch or self.n_threads

        mode = self._embedding_mode()
        self.generates = mode != "only"
        if self.generates:
            n_batch = self._open_generation(path)
            if mmproj:
                self._open_projector(mmproj)
            spec = self._open_speculation(draft, n_batch, use_mtp)
            if adapters:
                self.adapters = Adapters(ll, model, adapters)
            self.sched = Scheduler(
                ll, self.ctx, self.mem, self.batch, self.vocab, self.tok, self.vocab_tables,
                n_ctx=self.n_ctx, n_batch=n_batch, prefill_chunk=cfg.prefill_chunk,
                parallel=cfg.parallel, on_job_end=job_over,
                features=Features(self.projector, self.draft_model, spec, self.adapters,
                                  self._prompt_cache(), mtp=self.mtp,
                                  canon=Canon(cfg.prefill_chunk) if cfg.deterministic
                                  else None))
        if mode in ("on", "only"):
            self.embedder = self._make_embedder(turns, only=mode == "only")
            if not self.generates:
                self.n_ctx = self.embedder.info.n_ctx
        self.n_vocab = self.vocab_tables.n
        self._report_placement(chosen)
        if self._verdict is not None:
            self.memory = {"check": cfg.memory_check, **self._verdict.as_dict(),
                           "reported": llama_log.seen.buffers}
        if self.n_ctx > self.n_ctx_train > 0:
            log.warning("CTX_SIZE gives each slot %d tokens of context, past the %d the model was "
                        "trained for: replies past that length may degrade", self.n_ctx,
                        self.n_ctx_train)
        self.max_prompt_bytes = cfg.max_prompt_bytes or self.n_ctx * self.vocab_tables.longest_piece
        log.info(
            "loaded %s: %d slots x %d tokens of context, gpu offload=%s, gpu_layers=%d, "
            "split_mode=%s, tensor_split=%s, main_gpu=%d, threads=%d, cpu extra buffers=%s",
            path, cfg.parallel, self.n_ctx, gpu, self.gpu_layers, cfg.split_mode,
            cfg.tensor_split or "by free memory", cfg.main_gpu, self.n_threads,
            "on" if extra else "off",
        )

    def card(self, path: str) -> ModelInfo:
        """What /v1/models, /props and the responses report of this model."""
        ll, cfg = self.ll, self.cfg
        template = cfg.chat_template
        if template is None:
            raw = ll.llama_model_chat_template(self.model, None)
            template = raw.decode("utf-8", errors="replace") if raw else None
        # SERVED_MODEL_NAME: the id, then the other aliases (normalized by the settings)
        names = tuple(cfg.served_model_name.split(",")) if cfg.served_model_name else ()
        return ModelInfo(
            name=(names or (_model_name(path),))[0],
            aliases=names or (_model_name(path),),
            tags=tuple(cfg.model_tags.split(",")) if cfg.model_tags else (),
            n_embd=ll.llama_model_n_embd(self.model),
            n_params=ll.llama_model_n_params(self.model),
            size=ll.llama_model_size(self.model),
            vocab_type=vocab_type_name(ll.llama_vocab_type(self.vocab)),
            architecture=self._meta("general.architecture") or "",
            quantization=self._quantization(),
            gpu_offload=self.gpu_layers != 0,
            path=path,
            n_ctx=self.n_ctx,
            n_ctx_train=self.n_ctx_train,
            chat_template=template,
            bos_token=self.tok.text_of(self.tok.bos),
            eos_token=self.tok.text_of(ll.llama_vocab_eos(self.vocab)),
            pad_token=self.tok.text_of(ll.llama_vocab_pad(self.vocab)),
            add_bos=self.tok.add_bos,
            created=int(time.time()),
            n_vocab=self.n_vocab,
            control_texts=self._special_texts(template),
            cpu_extra_buffers=self.extra_buffers,
            system_info=self.system_info,
            cuda=self.cuda,
            cxx_runtime=cxx_runtime.runtime().as_dict(),
            vision=self.projector is not None and self.projector.vision,
            audio_rate=self.projector.audio_rate if self.projector is not None else 0,
            merges_frames=self.projector is not None and self.projector.merges_frames,
            placement=self.placement,
            memory=self.memory,
            adapters=tuple((f.name, f.scale) for f in self.adapters.files)
            if self.adapters is not None else (),
            reranks=self.embedder is not None and self.embedder.info.rank is not None,
        )

    def _special_texts(self, template: str | None) -> tuple[str, ...]:
        """The texts message text must not turn into tokens (app.formats.chat_template's
        protector): every control token's, and each user-defined token's the chat template
        writes (its structure: GPT-OSS's <|channel|>, which llama.cpp makes user-defined and
        matches even in plain text), longest first."""
        t = template or ""
        used = {u for u in self.vocab_tables.user_defined_texts if u in t}
        return tuple(sorted({*self.vocab_tables.control_texts, *used}, key=len, reverse=True))

    def _split_params(self, mparams) -> None:
        """SPLIT_MODE, TENSOR_SPLIT and MAIN_GPU into llama.cpp's model parameters; more
        shares than llama.cpp can take devices is a load error, not a silent cut."""
        ll, cfg = self.ll, self.cfg
        mparams.split_mode = _SPLIT[cfg.split_mode]
        mparams.main_gpu = cfg.main_gpu
        if cfg.tensor_split:
            shares = [float(p) for p in cfg.tensor_split.split(",")]
            n_max = ll.llama_max_devices()
            if len(shares) > n_max:
                raise ModelLoadError(
                    f"TENSOR_SPLIT has {len(shares)} shares; this build takes at most {n_max} "
                    "devices")
            self._tensor_split = (ctypes.c_float * n_max)(*shares)  # alive while loading
            mparams.tensor_split = self._tensor_split

    def _prompt_cache(self) -> PromptCache | None:
        """The host-RAM prompt cache of this context (PROMPT_CACHE_RAM_MB; None: off), at most
        half the host RAM the memory check found left after the load: the cache fills only as
        conversations lose their slots, so a bound the container cannot hold would end in the
        OOM killer hours after start."""
        cfg = self.cfg
        bound = cfg.prompt_cache_ram_mb << 20
        room = self._verdict.budget.of("CPU") if self._verdict is not None else None
        if room is not None and bound:
            left = max(0, room - self._verdict.footprint.need("CPU")) // 2
            if left < bound:
                log.warning("prompt cache: %d MiB, not PROMPT_CACHE_RAM_MB=%d: half the host "
                            "RAM left after this model's load", left >> 20,
                            cfg.prompt_cache_ram_mb)
                bound = left
        if bound < 1 << 20:
            if not cfg.prompt_cache_dir:
                return None
            bound = 0  # no room in RAM: what leaves a slot goes to PROMPT_CACHE_DIR at once
        ll = self.ll
        return PromptCache(bound, cfg.prompt_cache_min_tokens,
                           whole_only=bool(ll.llama_model_is_recurrent(self.model)
                                           or ll.llama_model_is_hybrid(self.model)))

    def _open_generation(self, path: str) -> int:
        """The generation context: PARALLEL slots of CTX_SIZE tokens each, and its batch; the
        batch's capacity."""
        ll, cfg = self.ll, self.cfg
        # ctx_size is per slot: the KV cache holds parallel x ctx_size cells.
        n_ctx_slot = cfg.ctx_size or self.n_ctx_train
        # a step holds one token per slot plus a prompt chunk: the batch must take them all
        n_batch = max(cfg.batch_size, cfg.prefill_chunk + cfg.parallel)
        self.ctx, self.mem = open_context(
            ll, self.model, f"model {path}: a context", "lower CTX_SIZE or PARALLEL",
            n_ctx=n_ctx_slot * cfg.parallel,
            n_batch=n_batch,
            n_ubatch=min(n_batch, cfg.n_ubatch or 512),
            n_seq_max=cfg.parallel,
            type_k=placement.GGML_TYPES[cfg.kv_cache_type_k],
            type_v=placement.GGML_TYPES[cfg.kv_cache_type_v],
            n_threads=self.n_threads,
            n_threads_batch=self.n_threads_batch,
            flash_attn_type=FLASH[cfg.flash_attn],
            # One KV stream per slot: a token attends over its own sequence's cells only (a
            # unified buffer makes every token scan the cells of all slots, idle caches included).
            kv_unified=False,
        )
        # what one sequence may hold: llama.cpp may round the total per sequence
        self.n_ctx = min(n_ctx_slot, ll.llama_n_ctx_seq(self.ctx))
        self._kv_mib = llama_log.seen.kv_cache_mib  # this context's (an embedding one may follow)
        self.batch = ll.llama_batch_init(n_batch, 0, 1)
        return n_batch

    def _open_speculation(self, draft: str | None, n_batch: int,
                          use_mtp: bool) -> SpecConfig | None:
        """Speculative decoding: the draft model, when DRAFT_MODEL names one, opened beside the
        model (its layers where the model's are, one sequence per slot), or the model's MTP
        head (SPEC_MTP), and the limits (None: off). The server drafts on its own with
        DRAFT_MODEL, MTP or SPEC_NGRAM; without, only requests that bring a prediction
        (Predicted Outputs) are drafted for."""
        cfg = self.cfg
        ll = self.ll
        if cfg.deterministic:
            # a checked draft is decoded in rows of the draft's length, not one at a time
            log.info("DETERMINISTIC: one sequence per step, prompts cut at multiples of %d "
                     "tokens; speculative decoding (a request's prediction too) is off",
                     cfg.prefill_chunk)
            return None
        if use_mtp and ll.llama_model_n_layer_nextn(self.model) <= 0:
            if cfg.spec_mtp == "on":
                raise ModelLoadError("SPEC_MTP=on: llama.cpp loaded no MTP layers of this model")
            use_mtp = False
        server = draft is not None or cfg.spec_ngram or use_mtp
        if ll.llama_model_is_recurrent(self.model) or ll.llama_model_is_hybrid(self.model):
            # its memory cannot drop a rejected draft's tail: the cache would hold it
            if server:
                log.warning("speculative decoding is off: this model's recurrent memory cannot "
                            "drop a rejected draft")
            return None
        if draft is not None:
            self._stage("loading", detail=os.path.basename(draft))
            self.draft_model = DraftModel(
                self.ll, draft, self.vocab, n_ctx=self.n_ctx, n_seq=cfg.parallel,
                n_batch=n_batch, gpu_layers=self.gpu_layers, threads=self.n_threads,
                flash_attn=FLASH[cfg.flash_attn])
        if use_mtp:
            import llama_cpp.llama_cpp_ext as ext  # the NextN hidden states' calls

            try:
                self.mtp = mtp.MtpDrafter(
                    ll, ext, self.model, self.ctx, n_ctx=self.n_ctx, n_seq=cfg.parallel,
                    n_batch=n_batch, n_ubatch=min(n_batch, cfg.n_ubatch or 512),
                    threads=self.n_threads, flash_attn=FLASH[cfg.flash_attn],
                    draft_max=min(cfg.spec_mtp_draft_max, cfg.spec_draft_max))
            except ModelLoadError as err:
                if cfg.spec_mtp == "on":
                    raise
                log.warning("multi-token prediction is off: %s", err)
                return self._open_speculation(draft, n_batch, False)
            log.info("speculative decoding: the model's MTP layers (%d), up to %d tokens "
                     "drafted per step", ll.llama_model_n_layer_nextn(self.model),
                     self.mtp.draft_max)
        spec = SpecConfig(cfg.spec_draft_max, cfg.spec_draft_min, cfg.spec_p_min,
                          cfg.spec_ngram, cfg.spec_adaptive, server)
        if server and not use_mtp:
            log.info("speculative decoding: %s, up to %d tokens drafted per step",
                     f"draft model {draft}" + (" and n-gram lookup" if cfg.spec_ngram else "")
                     if draft else "n-gram lookup", cfg.spec_draft_max)
        return spec

    def _report_placement(self, chosen: list[placement.Rule]) -> None:
        """What /props shows of the placement settings as loaded, and the log line that says
        where overridden tensors went (llama.cpp says it per tensor, at debug level)."""
        moved = llama_log.seen.overridden
        self.placement = {
            "kv_cache_type_k": self.cfg.kv_cache_type_k,
            "kv_cache_type_v": self.cfg.kv_cache_type_v,
            "kv_cache_mib": self._kv_mib,
            "n_ubatch": self.ll.llama_n_ubatch(self.ctx) if self.ctx else None,
            "deterministic": self.cfg.deterministic,
            "tensor_overrides": [{"pattern": r.pattern, "buffer_type": r.buft} for r in chosen],
            "tensors_moved": {buft: len(names) for buft, names in moved.items()},
        }
        if chosen and not moved:
            log.warning("tensor overrides (%s) matched no tensor of this model",
                        ", ".join(r.pattern for r in chosen))
        for buft, names in moved.items():
            log.info("tensor overrides: %d tensors to %s (%s%s)", len(names), buft,
                     ", ".join(names[:4]), ", ..." if len(names) > 4 else "")

    def _open_projector(self, path: str) -> None:
        """MMPROJ (a local path, app.model.source.resolve_projector): libmtmd over the model,
        on the GPU when the model's layers are there (and MMPROJ_OFFLOAD allows)."""
        self._stage("loading", detail=os.path.basename(path))
        on_gpu = self.cfg.mmproj_offload and self.gpu_layers != 0
        self.projector = Projector(self.ll, self.model, path, use_gpu=on_gpu,
                                   n_threads=self.n_threads,
                                   cache_bytes=self.cfg.image_cache_mb << 20)
        log.info("projector %s loaded (on the %s): reads %s", path, "GPU" if on_gpu else "CPU",
                 " and ".join(k for k, on in (("images", self.projector.vision),
                                              ("audio", self.projector.audio_rate)) if on))

    def _quantization(self) -> str:
        """The file type as llama.cpp names it: the last word of its model description
        ("llama 8B Q4_K_M")."""
        buf = ctypes.create_string_buffer(256)
        self.ll.llama_model_desc(self.model, buf, 256)
        words = buf.value.decode("utf-8", "replace").split()
        return words[-1] if words else ""

    def _meta(self, key: str) -> str | None:
        """A GGUF metadata value, as text."""
        buf = ctypes.create_string_buffer(256)
        n = self.ll.llama_model_meta_val_str(self.model, key.encode(), buf, 256)
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def _arch_meta(self, key: str) -> str | None:
        """A metadata value under the model's architecture prefix (``bert.pooling_type``)."""
        return self._meta(f"{self._meta('general.architecture') or ''}.{key}")

    def _embedding_mode(self) -> str:
        """EMBEDDINGS resolved for this model: an embedding GGUF (non-causal attention, or a
        pooling type in its metadata) embeds only under auto; a generative one embeds only when
        asked (EMBEDDINGS=on: the embedding context costs memory)."""
        embedding_model = (self._arch_meta("attention.causal") == "false"
                           or self._arch_meta("pooling_type") is not None)
        mode = self.cfg.embeddings
        if mode == "auto":  # a generative model's embedding context costs memory: asked for
            mode = "only" if embedding_model else "off"
        if mode != "off" and self.ll.llama_model_has_encoder(self.model):
            if mode == "only":
                raise ModelLoadError("embeddings of encoder-decoder models are not supported")
            log.warning("embeddings are off: encoder-decoder models are not supported")
            mode = "off"
        return mode

    def _make_embedder(self, turns: DecodeTurns, only: bool) -> LlamaEmbedder:
        cfg = self.cfg
        pooling = cfg.embedding_pooling
        if pooling == "auto":
            code = self._arch_meta("pooling_type")
            pooling = POOLING_IDS.get(int(code), "none") if code and code.isdigit() else "mean"
        cap = DEFAULT_MAX_CTX if only else GENERATIVE_MAX_CTX
        n_ctx = cfg.embedding_ctx or min(self.n_ctx_train or cap, cap)
        embed_cfg = EmbedConfig(
            pooling=pooling,
            n_ctx=n_ctx,
            n_seq=min(cfg.embedding_batch, n_ctx),
            max_queue=cfg.max_queue,
            share_tokens=cfg.prefill_chunk,
            threads=self.n_threads,
            threads_batch=self.n_threads_batch,
            flash_attn=FLASH[cfg.flash_attn],
            only=only,
        )
        return LlamaEmbedder(
            self.ll, self.model, self.vocab, embed_cfg,
            tokenize=lambda text: self.tok.tokens(text, add_bos=True, special=False),
            max_input_bytes=n_ctx * self.vocab_tables.longest_piece,
            n_vocab=self.vocab_tables.n,
            turns=turns,
        )

    # ---- free ------------------------------------------------------------------------------
    def free(self) -> None:
        """Free every llama.cpp object (to sleep, or at exit): the embedding context goes
        before the model it runs on."""
        ll = self.ll
        if self.embedder:
            self.embedder.close()
        if self.projector is not None:
            self.projector.close()
            self.projector = None
        if self.draft_model is not None:
            self.draft_model.free()
            self.draft_model = None
        if self.mtp is not None:  # before the target context it reads
            self.mtp.free()
            self.mtp = None
        if self.adapters is not None:  # before the model they were made for
            self.adapters.free()
            self.adapters = None
        for slot in self.sched.slots if self.sched is not None else []:
            slot.kv.freed()  # with the context below
        cache = self.sched.features.prompt_cache if self.sched is not None else None
        if cache is not None:
            cache.clear()  # its blobs are this context's: host RAM freed with it
        if self.ctx:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            ll.llama_model_free(self.model)
            self.model = None
        self._holds.release()


def _model_name(path: str) -> str:
    base = os.path.basename(path)
    return base[: -len(".gguf")] if base.lower().endswith(".gguf") else base
