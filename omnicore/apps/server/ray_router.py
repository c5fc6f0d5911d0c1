"""Which Speaker replica a request goes to on Ray Serve: its voice's home first.

Serve's multiplexed routing learns which replica holds a voice from its controller, which
collects it from every replica once a control loop. Until that news arrives, a voice's next
request can land on another replica and load the voice's prompt there too. This router keeps
each voice's home, the replica it last sent the voice to, from the moment a replica accepts
the request, so the voice's next request goes home without waiting for the controller. When
home is gone or full, Serve's own choice follows: two random replicas among those that hold
the voice (or, for a voice none holds, those that hold the fewest), the shorter queue first.

Built from Serve's public request-router parts (`ray.serve.request_router`, alpha in Ray 2.60);
imported only by Serve, in the process that routes (Front).
"""

from __future__ import annotations

import random
from collections import OrderedDict

from ray.serve.request_router import (FIFOMixin, LocalityMixin, MultiplexMixin, PendingRequest,
                                      ReplicaID, RequestRouter, RunningReplica)

HOMES = 4096  # voices whose home is remembered (least recently routed forgotten first)


class VoiceRouter(FIFOMixin, LocalityMixin, MultiplexMixin, RequestRouter):
    def initialize_state(self, **kwargs):
        self.homes: OrderedDict[str, ReplicaID] = OrderedDict()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        """Ranks of replicas, tried in order: the voice's home, then two random picks of
        Serve's multiplexed (or, without a voice, locality) candidates."""
        voice = pending_request.metadata.multiplexed_model_id if pending_request else ""
        if voice:
            ids = self.apply_multiplex_routing(pending_request=pending_request)
        else:
            ids = self.apply_locality_routing(pending_request=pending_request)
        picks = [r for r in candidate_replicas if r.replica_id in ids]
        ranks = [random.sample(picks, min(2, len(picks)))]
        home = self.homes.get(voice)
        if home is not None:
            ranks.insert(0, [r for r in candidate_replicas if r.replica_id == home])
        return [rank for rank in ranks if rank]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result) -> None:
        voice = pending_request.metadata.multiplexed_model_id
        if voice:
            self.homes[voice] = replica_id
            self.homes.move_to_end(voice)
            if len(self.homes) > HOMES:
                self.homes.popitem(last=False)
