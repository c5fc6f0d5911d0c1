"""The apps: programs and integrations built on the core API (`omnicore.OmniVoice`), never the
other way round.

    cli/            the `omnicore` command (say, clone-prompt, batch, codec, serve, mcp, ...)
    server/         the doors: the OpenAI-compatible HTTP server, its WebSocket, Wyoming and MCP,
                    all speaking through one path (server/speaking.py)
    voice_agents/   LiveKit Agents' and Pipecat's TTS classes over the server's WebSocket
    cluster.py      `omnicore batch --ray`: jobs on Ray actors, resumable
    script.py       multi-speaker scripts: one voice per speaker, one output
"""
