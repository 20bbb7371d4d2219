"""The run's datasets: the embedded byte corpus, PaddleFormers pretraining data, or a stored teacher's windows
(paddle_vha/train/stored_teacher.py), checked against the model's vocabulary before anything is built."""
from __future__ import annotations

from .errors import TrainError

__all__ = ["check_data_fits", "build_data"]


def check_data_fits(model_args, data_args, config) -> None:
    """TrainError (one line) for data whose token ids the model cannot take, or byte data for a model with a tokenizer
    and a larger vocabulary (paddle_vha/train/data_checks.py); before any dataset is built."""
    from .data_checks import check_stdlib_fits, check_token_ids, tokenizer_folder
    from .datasets import data_prefixes

    tokenizer = tokenizer_folder(model_args)
    if data_args.dataset == "stdlib":
        check_stdlib_fits(config.vocab_size, tokenizer)
    elif data_args.dataset == "pretrain" and data_args.input_dir:
        try:
            _, prefixes = data_prefixes(data_args.input_dir)
        except ValueError as e:
            raise TrainError(str(e))
        check_token_ids(prefixes, config.vocab_size, tokenizer)


def build_data(data_args, training_args, vocab_size=None, store=None):
    from .datasets import pretrain_datasets, stdlib_datasets

    S = data_args.max_seq_len
    if S < 1:
        raise TrainError(f"max_seq_len must be >= 1, got {S}")
    world = max(1, training_args.dataset_world_size)
    steps = training_args.max_steps if training_args.max_steps > 0 else 0
    n_train = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * world * steps
    if store is not None:  # the stored teacher's windows (checked against the run by teacher.check_store_run)
        return stored_teacher_data(store, data_args, training_args, n_train)
    try:
        if data_args.dataset == "stdlib":
            train, val, info = stdlib_datasets(S, corpus_mb=data_args.corpus_mb, val_fraction=data_args.val_fraction,
                                               seed=training_args.seed, num_train_samples=max(n_train, 1) if steps else None,
                                               max_eval_samples=data_args.max_eval_samples)
            desc = (f"{info['source']}: {info['files']} files, {info['train_tokens']:,} train / "
                    f"{info['val_tokens']:,} validation byte tokens")
        elif data_args.dataset == "pretrain":
            if not data_args.input_dir:
                raise TrainError("dataset=pretrain needs input_dir (PaddleFormers pretraining data: PREFIX.bin + "
                                 "PREFIX.idx)")
            train, val = pretrain_datasets(data_args.input_dir, S, split=data_args.split, seed=training_args.seed,
                                           num_train_samples=max(n_train, 1), num_eval_samples=data_args.max_eval_samples,
                                           data_cache=data_args.data_cache, vocab_size=vocab_size)
            desc = f"PaddleFormers pretraining data {data_args.input_dir} (split {data_args.split})"
        else:
            raise TrainError(f"dataset {data_args.dataset!r} is not one of stdlib, pretrain")
    except (ValueError, FileNotFoundError) as e:
        raise TrainError(str(e))
    return train, val, desc


def stored_teacher_data(store, data_args, training_args, n_train: int):
    """(train, val, description) from a stored teacher's windows: the last windows (max_eval_samples, at most a
    twentieth) held out for validation, plain cross-entropy samples; the others train, each with its stored teacher
    outputs, visited in the seeded order of ByteWindows."""
    from .datasets import ByteWindows, TeacherWindows
    from .stored_teacher import stream_of

    S = store.seq_len
    stream = stream_of(store.data_prefix)
    n = store.meta["windows"]
    n_val = min(max(1, data_args.max_eval_samples), max(1, n // 20))
    if n - n_val < 1:
        raise TrainError(f"teacher {store.path}: {n} windows, too few to hold {n_val} out for validation")
    train = TeacherWindows(stream[: (n - n_val) * S + 1], S, store, seed=training_args.seed,
                           num_samples=n_train if n_train else None)
    val = ByteWindows(stream[(n - n_val) * S: n * S + 1], S, seed=None)
    desc = (f"stored teacher {store.path}: {store.data_prefix}, {n - n_val:,} train / {n_val:,} validation windows "
            f"of {S} tokens, top-{store.k} teacher log-probabilities each")
    return train, val, desc
