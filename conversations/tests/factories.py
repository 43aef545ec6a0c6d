"""factory_boy factories of the conversations app (the device factories are devices')."""
from __future__ import annotations

import factory


class PersonaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "conversations.Persona"

    name = factory.Sequence(lambda n: f"Persona {n}")
