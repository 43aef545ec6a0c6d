"""factory_boy factories of the conversations app (the device factories are devices')."""
from __future__ import annotations

import factory

from conversations.models import Persona
from testing.model_factory import ModelFactory


class _PersonaFactory(factory.django.DjangoModelFactory[Persona]):
    class Meta:
        model = "conversations.Persona"

    name = factory.Sequence(lambda n: f"Persona {n}")
    # The fixed silence window, so a test's timing does not hang on the end-of-turn model's
    # opinion of espeak; tests of smart turn detection say so.
    turn_detection = "silence"


PersonaFactory = ModelFactory(_PersonaFactory)
