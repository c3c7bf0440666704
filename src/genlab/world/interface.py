"""The method interface (StepContext, Extra, Method), re-exported from genlab.methods.base where it lives."""
from genlab.methods.base import Extra, Method, StepContext  # noqa: F401
