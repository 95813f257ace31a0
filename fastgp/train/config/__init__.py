"""The trainer's configuration, declared once (``fields.TrainConfig``): each field's type,
default, flag and help in one declaration, read by the parser, the recipes, the run's records and
``fastgp check``.

    fields.py    TrainConfig, each field with its Flag; FLAGS (field -> flag)
    checks.py    ConfigError and the checks TrainConfig runs on construction
    choices.py   the names fields may take (kinds, precisions, critics, second orders)
    values.py    parsers of one flag value each (positive_int, number(low, high), seed, ...)
"""

from fastgp.train.config.checks import ConfigError as ConfigError
from fastgp.train.config.choices import CONFIG_SECOND_ORDER as CONFIG_SECOND_ORDER
from fastgp.train.config.choices import CRITICS as CRITICS
from fastgp.train.config.choices import INT32_MAX as INT32_MAX
from fastgp.train.config.choices import PRECISIONS as PRECISIONS
from fastgp.train.config.choices import SEED_RANGE as SEED_RANGE
from fastgp.train.config.choices import TRAIN_KINDS as TRAIN_KINDS
from fastgp.train.config.choices import ConfigSecondOrder as ConfigSecondOrder
from fastgp.train.config.choices import CriticName as CriticName
from fastgp.train.config.choices import Precision as Precision
from fastgp.train.config.choices import TrainKind as TrainKind
from fastgp.train.config.fields import FLAGS as FLAGS
from fastgp.train.config.fields import Flag as Flag
from fastgp.train.config.fields import TrainConfig as TrainConfig
from fastgp.train.config.fields import flag_of as flag_of

__all__ = [
    "CONFIG_SECOND_ORDER",
    "CRITICS",
    "FLAGS",
    "INT32_MAX",
    "PRECISIONS",
    "SEED_RANGE",
    "TRAIN_KINDS",
    "ConfigError",
    "ConfigSecondOrder",
    "CriticName",
    "Flag",
    "Precision",
    "TrainConfig",
    "TrainKind",
    "flag_of",
]
