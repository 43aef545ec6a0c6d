"""factory_boy factories of the conversations app (the device factories are devices')."""
from __future__ import annotations

import factory


class PersonaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "conversations.Persona"

    name = factory.Sequence(lambda n: f"Persona {n}")
    # The fixed silence window, so a test's timing does not hang on the end-of-turn model's
    # opinion of espeak; tests of smart turn detection say so.
    turn_detection = "silence"
