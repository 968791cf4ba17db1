"""An SGLang replica emulator: HTTP API, paged radix cache with GPU/host/storage tiers, and timing."""
