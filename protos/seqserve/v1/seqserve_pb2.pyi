from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_DEADLINE: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_DEADLINE: FinishReason

class DecodingOptions(_message.Message):
    __slots__ = ("max_new_tokens", "min_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "stop", "seed", "num_beams", "num_return_sequences", "length_penalty", "early_stopping", "return_logprobs", "top_logprobs")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    NUM_BEAMS_FIELD_NUMBER: _ClassVar[int]
    NUM_RETURN_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    min_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    num_beams: int
    num_return_sequences: int
    length_penalty: float
    early_stopping: bool
    return_logprobs: bool
    top_logprobs: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., min_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., num_beams: _Optional[int] = ..., num_return_sequences: _Optional[int] = ..., length_penalty: _Optional[float] = ..., early_stopping: _Optional[bool] = ..., return_logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("input", "options", "model", "source_language", "target_language")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    input: str
    options: DecodingOptions
    model: str
    source_language: str
    target_language: str
    def __init__(self, input: _Optional[str] = ..., options: _Optional[_Union[DecodingOptions, _Mapping]] = ..., model: _Optional[str] = ..., source_language: _Optional[str] = ..., target_language: _Optional[str] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top_logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class Sequence(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "cumulative_logprob", "score", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    CUMULATIVE_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    cumulative_logprob: float
    score: float
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., cumulative_logprob: _Optional[float] = ..., score: _Optional[float] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "generated_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    generated_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_seconds", "first_token_seconds", "total_seconds")
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    queue_seconds: float
    first_token_seconds: float
    total_seconds: float
    def __init__(self, queue_seconds: _Optional[float] = ..., first_token_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "usage", "timings", "seed", "sequences")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    seed: int
    sequences: _containers.RepeatedCompositeFieldContainer[Sequence]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., seed: _Optional[int] = ..., sequences: _Optional[_Iterable[_Union[Sequence, _Mapping]]] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "usage", "timings", "seed", "sequences")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    seed: int
    sequences: _containers.RepeatedCompositeFieldContainer[Sequence]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., seed: _Optional[int] = ..., sequences: _Optional[_Iterable[_Union[Sequence, _Mapping]]] = ...) -> None: ...

class GenerateBatchRequest(_message.Message):
    __slots__ = ("inputs", "options", "model", "source_language", "target_language", "target_languages")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    options: DecodingOptions
    model: str
    source_language: str
    target_language: str
    target_languages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., options: _Optional[_Union[DecodingOptions, _Mapping]] = ..., model: _Optional[str] = ..., source_language: _Optional[str] = ..., target_language: _Optional[str] = ..., target_languages: _Optional[_Iterable[str]] = ...) -> None: ...

class GenerateBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GenerateResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[GenerateResponse, _Mapping]]] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ConfigValue(_message.Message):
    __slots__ = ("int_value", "double_value", "bool_value", "string_value")
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    int_value: int
    double_value: float
    bool_value: bool
    string_value: str
    def __init__(self, int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., bool_value: _Optional[bool] = ..., string_value: _Optional[str] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("config", "bundle_format_version", "variant", "execution_provider", "onnxruntime_version", "limits", "quality", "option_ranges", "model", "models", "memory_bytes", "languages", "source_language_placement")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ConfigValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ConfigValue, _Mapping]] = ...) -> None: ...
    class QualityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class OptionRangesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: FloatRange
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[FloatRange, _Mapping]] = ...) -> None: ...
    class LanguagesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    ONNXRUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    OPTION_RANGES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANGUAGE_PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    config: _containers.MessageMap[str, ConfigValue]
    bundle_format_version: int
    variant: str
    execution_provider: str
    onnxruntime_version: str
    limits: Limits
    quality: _containers.ScalarMap[str, float]
    option_ranges: _containers.MessageMap[str, FloatRange]
    model: str
    models: _containers.RepeatedScalarFieldContainer[str]
    memory_bytes: int
    languages: _containers.ScalarMap[str, int]
    source_language_placement: str
    def __init__(self, config: _Optional[_Mapping[str, ConfigValue]] = ..., bundle_format_version: _Optional[int] = ..., variant: _Optional[str] = ..., execution_provider: _Optional[str] = ..., onnxruntime_version: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., quality: _Optional[_Mapping[str, float]] = ..., option_ranges: _Optional[_Mapping[str, FloatRange]] = ..., model: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., memory_bytes: _Optional[int] = ..., languages: _Optional[_Mapping[str, int]] = ..., source_language_placement: _Optional[str] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_input_tokens", "max_new_tokens", "max_batch_size", "max_waiting", "max_batch_inputs", "max_stop_strings", "default_max_new_tokens", "max_stop_string_bytes", "max_stop_bytes", "max_receive_message_bytes", "max_inflight_bytes", "max_num_beams", "max_top_logprobs")
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_INPUTS_FIELD_NUMBER: _ClassVar[int]
    MAX_STOP_STRINGS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_STOP_STRING_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STOP_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_RECEIVE_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_INFLIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BEAMS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    max_input_tokens: int
    max_new_tokens: int
    max_batch_size: int
    max_waiting: int
    max_batch_inputs: int
    max_stop_strings: int
    default_max_new_tokens: int
    max_stop_string_bytes: int
    max_stop_bytes: int
    max_receive_message_bytes: int
    max_inflight_bytes: int
    max_num_beams: int
    max_top_logprobs: int
    def __init__(self, max_input_tokens: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., max_waiting: _Optional[int] = ..., max_batch_inputs: _Optional[int] = ..., max_stop_strings: _Optional[int] = ..., default_max_new_tokens: _Optional[int] = ..., max_stop_string_bytes: _Optional[int] = ..., max_stop_bytes: _Optional[int] = ..., max_receive_message_bytes: _Optional[int] = ..., max_inflight_bytes: _Optional[int] = ..., max_num_beams: _Optional[int] = ..., max_top_logprobs: _Optional[int] = ...) -> None: ...

class FloatRange(_message.Message):
    __slots__ = ("min", "max", "min_exclusive")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    MIN_EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    min: float
    max: float
    min_exclusive: bool
    def __init__(self, min: _Optional[float] = ..., max: _Optional[float] = ..., min_exclusive: _Optional[bool] = ...) -> None: ...
