//! Per-context prefix indexes.
//!
//! # Layout
//!
//! Files, each using only the ones listed before it (`scripts/check-deps.py` checks this):
//!
//! - `table`: the sharded block table, 64-bit block key → compact holder set (one inline entry,
//!   or the value of an interned set shared by every block with the same entries).
//! - `answer`: the answer types ([`QueryHits`], [`InstanceHits`], [`TierCounts`]).
//! - `plan`: the context's metadata (listed ranks and their holders) behind its lock, and the
//!   walk's plan and answer template cached from it until it changes.
//! - `shared`: what the single writer shares with its readers (table, metadata, aliases).
//! - [`query`]: the prefix walk ([`HashList`] names a prompt by its block hashes).
//! - [`handle`]: [`IndexReader`], the read handle queries and the global view use.
//! - [`budget`]: the memory budget every context shares ([`Budget`]: bounds, the estimate of
//!   all contexts, what eviction did), and `evict_order`, the order a context's blocks go in
//!   (oldest chain first, deepest block first; see "Memory budget" in `docs/durability.md`).
//! - `holder`: the writer's per-holder state and the reuse of reclaimed holder ids.
//! - `image`: the plain records a context hands to checkpoints ([`ContextChanges`],
//!   [`Watermark`], [`HolderRecord`]); [`crate::durability`] encodes them.
//! - [`context`]: [`ContextIndex`], the plain struct that is a context's single writer (apply
//!   batches, attach/detach sources, snapshots), unit-tested without any runtime; its
//!   `holders` file interns and reclaims holders, its `rekey` file moves pairs kept under a
//!   hash to the derived key when an alias names it, and [`context::persist`] takes a context's
//!   changes, and [`context::restore`] rebuilds a context from them ([`Restorer`]). Those stay here, not in
//!   [`crate::durability`], because they read and write the writer's private structure.
//! - [`actor`]: [`ContextActor`], a thin actix shell forwarding one call per message, and
//!   [`ContextHandle`] (its address plus the read handle).
//! - [`directory`]: [`ContextDirectory`], every live context by key, shared by the registry,
//!   the subscriptions and the query path.
//!
//! # Data model
//!
//! A holder is an engine (instance, rank) or a store backend, each qualified by the subscription
//! (source) that reported it: `Holder::Engine{instance, rank}` from source S and
//! `Holder::Shared{backend_id}` from S are interned once as a `u32` holder id. A holder that owns
//! nothing and whose rank no source lists is reclaimed, and its id is reused only once no plan
//! that routed it can still be in a walk (`holder`), so a query's plan stays valid while it
//! walks and the ids stay as few as the holders that exist. A block key maps to a small
//! set of `holder_id << 4 | tier bits` entries: inline for one holder, else a 32-bit id of an
//! interned, immutable, refcounted set of sorted entries, the same id for every block with the
//! same entries (see "Interned holder sets" below). Engines hold
//! device, cpu_local and (rank-local) disk; store backends hold cpu_share and (shared) disk; a
//! store into any other tier is counted in `invalid_ops` and ignored. Each holder keeps a
//! reverse list of its blocks (32-bit table references), so remove, clear, drop-source and detach
//! cost O(blocks that holder owns), never a scan of the context.
//!
//! # Keys
//!
//! Engine blocks are keyed by a key the index derives from what the event publishes
//! ([`crate::hashing::derived`]): the parent's derived key linked with the block's content (its
//! token ids, their count, and extras such as multimodal items), starting at a root that carries
//! the cache salt. The engine's own hashes become aliases (`aliases`: engine hash → derived key,
//! one map per context, persisted): removals, the parent of the next event, Mooncake store
//! objects and queries by hash name blocks by them. So an answer is exact whatever recipe the
//! engine hashes with (vLLM with `PYTHONHASHSEED` unset, a LoRA path, SGLang's adapter
//! namespace), and a query from tokens costs one fast multiply chain per block instead of
//! SHA-256.
//!
//! A derived key also names its shard in the table (its top 6 bits), inherited from its parent
//! within a segment of about 64 blocks (see [`crate::hashing::derived::link`] and "Segments"
//! below); a raw key's shard comes from its top bits when it is odd and from its slot hash
//! when it is even (`table`'s `shard_of_key`).
//!
//! A block the index cannot derive is kept under its published hash ("raw"): an event whose
//! parent this context never saw (a subscriber that joined mid-stream; guessing the parent would
//! risk a false hit), an event that leaves its extras out and that the registered profile does
//! not prove plain (sent by published hash, see `subscription::plain_proof`), a store object
//! whose hash has no alias yet (until it has one, see "Order of sources" below),
//! schema 1 data, and what migrations 5 and 6 kept when the
//! derived-key function changed (`migrations/`). Those keys are what the registered profile
//! computes when it matches the engine (for the query's salt), so while any raw pair
//! exists (`Shared::raw_pairs`, counted per holder) a query from tokens also walks the
//! registered profile's chain as each block's second key ([`crate::hashing::PrefixKeys::alt_key`])
//! and a block counts when held under either. Raw and derived keys are both 64-bit and meet only
//! by a 2^-64 chance.
//!
//! # Order of sources
//!
//! An engine's events and a Mooncake store's reach a context on different subscriptions, so a
//! store object can arrive before the engine event that makes its hash an alias, and after a
//! restart each source replays on its own. The index is the same in every interleaving of its
//! sources, because a published hash is keyed by its alias's derived key whenever the context
//! has that alias, and by itself only while it has none:
//!
//! - a store that names blocks by hash (a store object, an engine event without tokens, or one
//!   whose parent the context never saw) keys a hash that has an alias by the alias's key;
//! - when an engine event gives a hash its alias, every pair kept under that hash moves to the
//!   derived key (`context::rekey`, right after the store run that inserted the alias and so
//!   before any later op of the batch): it leaves the hash's block and joins the key's in each
//!   of its tiers, and its announcements add to what the holder already has there, so as many
//!   removals as announcements take it away, whichever came first.
//!
//! So the same events give the same blocks, pairs, counts, answers and, after a checkpoint, the
//! same records; only holder ids differ, as they follow first appearance. A checkpoint writes a
//! moved pair's two records (the hash's deleted, the key's written) and its holder's raw pair
//! count, so it stays proportional to what changed, and a restore rebuilds the moved pairs from
//! those records like any other. The cost: while the context keeps any pair under a published
//! hash, each alias an engine event adds (a block new to the context, not one announced again)
//! is looked up in the table once. Tests: `order_tests` (every interleaving of two sources, a
//! restart between them), `order_props` (random interleavings and restarts against a model).
//!
//! Not covered: the sweep (`ContextIndex::sweep_aliases`) forgets the aliases of blocks no
//! holder keeps once aliases outnumber blocks twice over, and when it runs depends on the block
//! count, so on the order. Which of those aliases are still in the map (and in the records)
//! therefore depends on the order too, and a store object that names a forgotten hash stays under
//! the hash until an engine announces the block again, which moves it. A store written by an
//! earlier version may hold a pair under a hash that has an alias: it stays there until removed
//! (a removal by hash still finds it, `context::removal`). A hash whose alias moves to another
//! key (one hash published for two contents) moves nothing already keyed.
//!
//! # Repeated announcements
//!
//! Stores and removes are counted per (holder, tier, block), not merged: a store adds one, a
//! remove takes one away, and the holder holds the block in that tier while its count is above
//! zero; clearing or dropping a holder resets its counts. vLLM's block pool does not deduplicate
//! (two identical prompts scheduled together both cache, and so both announce, the same hashes;
//! evicting one copy announces a removal while the other copy stays usable), and its offloading
//! tiers re-announce shared hashes and leave the counting to consumers; `src/wire/README.md` has
//! the rule of each publisher. The table keeps one tier bit per (holder, block), which is the
//! first announcement; only counts above one are kept, in a per-holder side map
//! (`HolderState::repeats`), so the common count of one costs no memory. Checkpoints write a
//! count beside a pair's tier bits only when it is above one.
//!
//! A rank is listed (reported in `instances()` and queried) while at least one source attached
//! it: a registration via `attach_rank`, or an engine source storing blocks for it (which covers
//! adapter contexts fed by a base registration). `drop_source` keeps the listing,
//! `detach_source` removes it.
//!
//! # Query semantics (`docs/python-api.md`, query())
//!
//! For each selected instance (all, or the filter) and each listed rank, one cursor walks the
//! prompt's blocks in four phases, device → cpu_local → cpu_share → disk, never going back. A
//! phase accepts block `c` when the block is held in that phase's tier *or any earlier one*,
//! counting for this rank: device and cpu_local (and engine disk) of the rank's own (instance,
//! rank) holders, cpu_share and disk of any store backend in the context. The cursor stays in the
//! earliest phase that accepts the block; a phase that rejects it ends with the count
//! `covered(c)` and the next phase tries the same block. After the disk phase rejects a block,
//! nothing later counts. So each phase's count is the longest prefix made only of blocks
//! available from that tier or an earlier one, which is exactly what the response fields mean
//! ("prefix tokens accessible using device and local CPU memory", …), and the counts are
//! cumulative: `device <= cpu_local <= cpu_share <= disk`.
//!
//! Why an earlier tier also satisfies a later phase: the reference's walk tests only the phase's
//! own tier, so a prompt `[device, cpu, device]` would report cpu = 2 blocks although all three
//! blocks are loadable from device or local CPU memory. With nested tier sets the cursor still
//! never goes back (the sets grow with the phase), every count keeps its documented meaning, and
//! a block in several tiers is still consumed once, by the earliest phase that accepts it.
//!
//! Instance figures are the max over the instance's ranks, `dp[rank]` is the rank's device
//! count, `longest_matched = disk`; listed ranks without any match appear with zeros. Token
//! counts come from `PrefixKeys::covered`, so complete-block (`vllm_v1`), partial-final-block
//! (`sglang`) and bigram-position (`sglang_bigram`) counting need nothing here. An unknown
//! filter or an empty prompt answers without error and without creating state. Rank keys are
//! `u32` in [`InstanceHits`]; transports render them as decimal strings.
//!
//! # Reads do not wait for writes, and hashing never runs under a lock
//!
//! The walk is block-major: all live cursors advance together, so block `i` is hashed (by
//! `PrefixKeys::key(i)`) once, and only a bounded distance ahead of the block the walk looks up
//! (`query::PREFETCH_AHEAD`, 8 blocks): the walk asks for the keys of the next blocks early to
//! bring their table lines into the CPU caches, so the cache misses of consecutive blocks
//! overlap. When every cursor has stopped, no further key is requested, and the lazy chain
//! hashes at most as many blocks again as the walk looked up (it links in bursts, see
//! [`crate::hashing::derived::DerivedChain`]).
//!
//! Block lookups take no lock (`table::view`): each shard keeps its slots and records in arrays
//! of atomic cells behind a sequence lock, so a lookup reads the shard's version, the block,
//! and the version again, and retries if the shard's writer changed anything in between. The
//! writer (one actor per context) still takes the shard's write lock, so writers exclude each
//! other as before and other readers (snapshots, stats) still lock; a lookup waits for the
//! writer at most for one write section of one shard. Arrays a writer replaced while growing
//! stay until no lookup is in flight. When a block's set differs from the previous block's, its
//! entries are read under the set lists' lock (taken by the writer only to add or free a set),
//! inside the same validated read. Fetching the cached plan takes the small metadata lock once.
//! Hashing therefore never holds a lock.
//!
//! A query thus reads each block at the moment it gets there rather than one consistent
//! snapshot; it is never torn inside a block. This is the same freshness a snapshot taken at
//! query start would have, and it costs nothing on the write path.
//!
//! Alternatives considered: a single `RwLock` around the map would make every concurrent reader
//! bounce one cache line per block; holding one lock for the whole walk would put hashing under
//! the lock (the reference's weakness); copy-on-write snapshots would cost a copy per write batch
//! on a map of millions of blocks. A read lock per shard and block (this module until the
//! side-by-side benchmark below) cost two atomic read-modify-writes per block, which on x86 also
//! order every load before them, so no two blocks' cache misses could overlap; without them and
//! with the prefetching, a 2,048-token query by keys went from 9.4 to 4.7-5.2 us on the same
//! (loaded) machine.

//! # Interned holder sets: the walk's cost per block does not grow with the holders
//!
//! The blocks of one prefix are nearly always held by the same holders in the same tiers: a
//! system prompt shared by every rank, a conversation on the rank that served it. So a block
//! held by two or more holders stores the id of an interned, immutable, refcounted set of sorted
//! entries (`table::sets`), equal for every block with equal entries. A store or remove replaces
//! the block's id by the id of the changed set, found through a small cache of transitions ("set
//! X plus entry e is set Y"), so a holder storing a chain of blocks that share a set costs no
//! hashing of the set per block, and through a content-hash index otherwise. The walk remembers
//! the previous block's value: when the next block has the same value, every live cursor
//! accepted the previous block in its phase and so accepts this one (O(1), no holder visited).
//! When the value changes, the cursors learn it one of two ways (`cursors`). With one holder per
//! cursor and no store backend (the usual fleet), the new block's entries alone say which
//! cursors stay in their phase: the cursors are bit sets per phase, and a change costs the new
//! entries, a few word operations per 64 cursors and a write per cursor whose phase ends.
//! Otherwise the walk merges the two blocks' sorted entries, keeps per cursor a count of its
//! holders per tier, and settles only the cursors that lost a tier. (On the side-by-side
//! workload the bit sets took a 2,048-token query by keys from 4.16 to 2.85 us of CPU, where
//! the merge had cost about 40 instructions per entry.) A freed set id can later name other
//! entries; a counter of such reuses, read under the shard lock with the value, tells the walk
//! when an equal value may mean something else.
//!
//! The query plan (holder id → cursor, instance order) and an answer template with every listed
//! rank at zero are built once per metadata change (`plan`), not per query; a query clones the
//! template and writes the counts in order, and [`IndexReader::query_into`] writes them into the
//! caller's previous answer, allocating nothing when the instances and ranks are the same.
//!
//! Measured on the same machine, before and after back to back (p50 of 20,000 queries, keys
//! precomputed, two runs each, before → after): 2k-token query over 64 instances x 2 ranks with a 32-block system
//! prompt on all 128 ranks and a disk backend holding the whole prompt (every cursor alive to the
//! end): 81-82 us → 11.0 us, and 5.8 us with `query_into`; an empty prompt (plan and answer
//! only): 16.1 us → 7.7 us; 64 x 2 ranks with staggered prefixes, where the holder set changes at
//! almost every block: 84 us → 24.5-24.8 us (25-26 us with a writer applying 7-9 M block ops/s
//! to the same context, p99 8.2 ms → under 0.11 ms). 128 holders storing one 16k-block prefix:
//! 8.2-9.0 → 23.2-23.5 M block stores/s; one holder storing blocks alone: unchanged (criterion
//! 7.1-7.7 ms vs 7.2-7.8 ms per 64k stores). Resident bytes per (block, holder) pair: 1 holder
//! per block unchanged (22.2 → 22.3 at 10M pairs), 2 holders 22.1-22.3 → 14.0, 4 holders 20.0 →
//! 10.4-10.6, 128 holders 15.8 → 5.2, 10M pairs at 4 holders 16.4 → 8.4; the worst case, nearly
//! every block with its own random set of 2 (4) of 1,024 holders: 25.4 → 24.3 (23.0-23.3 →
//! 19.5), thanks to a 4-byte-slot set index and exact-size chunks for small sets.
//!
//! Why not a compressed radix tree with per-edge holder sets: it gives the same O(1) step while
//! a prefix's holders stay the same, but it keys blocks by their position in a prefix, so every
//! store, remove, checkpoint and the holders' reverse lists would have to walk or rebuild paths;
//! the flat keyed table keeps O(1) lookup by key, the 64 shards, the 4-byte reverse references
//! and the checkpoint code as they are, and gets the same walk fast path from equal set ids. (The
//! tree was not built: with the table's walk at 30-40 ns per unchanged block, what is left of a
//! query is the probes themselves and the answer, which a tree would not remove.)
//!
//! # Chain hints: measured, not kept
//!
//! What a tree has that the table lacks is locality: an edge keeps a prefix's blocks side by
//! side, where the table scatters consecutive blocks over 64 shards by their keys. Tried: each
//! record 16 (then 20) bytes with a hint naming the record of the block stored after it by the
//! same holder (and one 4 blocks on, to prefetch), set by the writer after each store run and
//! validated by key by the walk, which then reads that record instead of probing. On the
//! side-by-side benchmark, ours / before, same runs at load 2-5: a 1M-token full hit by keys
//! 2.1-2.4 -> 0.5-0.6 ms while the table stays in the caches and 2.4-3.0 -> 1.2-2.0 ms when the
//! Dynamo passes in between evict it, from tokens 3.1-3.8 -> 1.5-2.2 and 3.4-4.6 -> 2.7-3.5 ms;
//! but 2,048-token queries over the 2.7 M-pair workload no faster (5.4-6.0 against 6.0-7.1 us:
//! following a hint waits for each record in turn where the keyed prefetch overlaps 8 blocks'
//! misses), and apply 10-15 % more CPU (one more random write per stored block) and +4-8 B per
//! block. Not kept: it trades ingest for long prompts only. What would make hints pay is
//! records allocated in chain order (one arena per context rather than per shard), so that a
//! hint is usually the next record and a walk reads a prefix sequentially like a tree's edge.
//!
//! # Next to Dynamo's radix tree (`benches/dynamo-compare`)
//!
//! One process, one seeded workload (64 instances x 2 ranks, 32 shared system prompts, 4,000
//! prompts published as engines do, 15 % tail evictions, 2.7 M live pairs), both indexes checked
//! to give the same per-holder overlap on 3,000 queries; ours keyed by derived keys with the
//! published hashes as aliases, answering into a reused answer. Ratios of runs in the same
//! process (ours / Dynamo's `ConcurrentRadixTreeCompressed`) on the shared 2-core machine, with
//! the reads under a per-shard `RwLock` (before) and lock-free with prefetching (after):
//!
//! | figure | before | after | schema 4 (three full runs, machine otherwise idle) | schema 5: segments (three full runs alternated with schema 4's), then following runs (three alternated with segments alone) |
//! |---|---|---|---|---|
//! | apply, M block ops/s | 0.56-0.75 | 0.75-0.95; 0.90-1.22 after "Apply" below | 1.00, 1.10, 1.26 (per CPU-second 1.05-1.32) | 1.43, 1.62, 1.49 (per CPU-second 1.52-1.70), schema 4 in the same runs 0.99-1.18; 1.24-1.79 |
//! | 2,048-token query by keys, p50 | 2.1-2.8 | 1.40-1.63 (4.8-5.0 us) | 1.23-1.36 (6.1-6.5 us) | 1.22-1.34 (5.5-6.8 us), schema 4 1.19-1.50; 1.17-1.42 (4.3-6.0 us) |
//! | 2,048-token query from tokens, p50 / p99 | 2.2-2.7 | 1.29-1.38 (6.1-6.5 us) | 1.20-1.23 / 1.09-1.42 | 1.04-1.08 / 0.94-1.16, schema 4 1.15-1.23 / 1.26-1.50; 0.90-1.03 / 1.01-1.19 |
//! | 1M-token full hit from tokens | 3.2-3.9 ms (10x) | 3.2-3.5 ms (9.4x) at load 2.4 | 3.59-4.10 ms (1.6-2.2 ms with the table in the caches) | 1.73-2.54 ms, schema 4 3.69-3.90 ms in the same runs; 1.09-1.48 ms |
//! | RSS per (block, holder) | 12.2 B (0.35x) | 12.1 B (0.35x) | 12.1 B (0.35x) | 12.4 B (0.35x) |
//!
//! (The machine ran slower in the last two columns' runs: Dynamo's own 2,048-token query from
//! tokens took 6.6-6.9 us (schema 4 column) and 6.3-7.5 us (schema 5) there, against 4.9-5.4
//! us at other moments.)
//!
//! **Then the cursors' bookkeeping** (bit sets in direct walks, one-pass answer fill, no slot
//! prefetch inside a segment, constant-size digests; see "Interned holder sets", "Segments" and
//! `cursors`). Three full runs, load 1.2-1.3, ours / Dynamo:
//!
//! | figure | run 1 | run 2 | run 3 |
//! |---|---|---|---|
//! | apply, M block ops/s | 1.37 | 1.73 | 1.47 |
//! | 2,048-token query by keys, p50 | 0.63 (3.1 us) | 0.64 (3.4 us) | 0.66 (3.2 us) |
//! | 2,048-token query from tokens, p50 / p99 | 0.64 / 0.80 | 0.62 / 0.91 | 0.63 / 0.86 |
//! | same, best of 3 rounds, p99 | 0.90 | 1.00 | 1.00 |
//! | 1M-token full hit from tokens | 1.31 ms | 1.37 ms | 1.16 ms |
//!
//! Cachegrind, per 2,048-token query from tokens (all 3,000 queries): ours 34.3 k instructions
//! (with the first, merging version of direct walks) -> 25.2 k, and about 100 misses of a 1 MiB
//! last level throughout; Dynamo 34.3 k and 160. What bounds
//! the p99 now: the latency passes alternate between the indexes, and the first ~30 queries of
//! each of our passes (1 % of them) run on caches Dynamo's pass filled; they warm the 32 system
//! prompts' records and the answer again. Fully cold (96 MiB written between queries) ours takes
//! 36 us against Dynamo's 55 us; the queries that match 96 blocks or more are about even
//! (thread CPU 4.5-5.5 against 6.6-6.7 us, best of 3 wall time 0.9-1.0x), their time spent
//! reading 8 KiB of tokens and about 20 slot or record lines.
//!
//! **Then the tail itself.** A full run can dump every sample (`DUMP_SAMPLES`, see the
//! benchmark's README). The 1 % of our from-token samples above the p99 were, in one run, 34
//! from the first 60 queries of a pass, 24 from queries matching 96 blocks or more and 32 from
//! those matching 60-95 (or machine spikes); Dynamo's, 45, 7 and 38. By depth, p50 of the
//! from-token samples, ours / Dynamo: 0.39 for walks of 8-32 blocks, 0.60 for 33-63, 0.80 for
//! 64-95 and 0.91 for 96+ (6.0 against 6.65 us), where Dynamo's hashing of all 128 blocks is
//! its floor for every depth. So the deep walks decide the ratio. Timing them in passes that
//! follow the other index's pass, with the query's tokens read just before the clock starts,
//! took ours 1-2 us off, far more than Dynamo (whose tight XXH3 loop streams them): the token
//! lines, asked for 4 blocks ahead, were still on the way. Asked for 16 blocks ahead
//! (`hashing::derived::TOKENS_AHEAD`), means of 5-6 alternated full runs: 2,048-token query
//! from tokens p99 0.82-0.87 -> 0.74-0.82 (single runs 0.64-0.86), the 96+ walks 0.97-1.03 ->
//! 0.93-0.98, p50 0.63-0.65 -> 0.61.
//!
//! Measured, not kept: 8 and 32 blocks ahead (p99 0.80 and 0.85), prefetching a whole prompt's
//! tokens when the chain is made (0.99 on the 96+ walks; it crowds the walk's own misses), and
//! looking ahead among the linked keys for the next segments' first blocks to bring their slot
//! and record lines in early (a walk that follows a segment reaches the next one at once, and
//! a profile shows the walk waiting there on the slot and then the record line): the walk's
//! samples fell by a sixth, but the from-token p99 stayed within noise (0.79 against 0.78 in six
//! alternated runs) and a 1M-token full hit cost 24 more instructions a block.
//!
//! **Longer segments (schema 6)** remove those waits at the source: with one block in 64
//! starting a segment instead of one in 16, the walk's steps into a new shard per query fell
//! from 3.2 to 0.8 (all steps from 10.4 to 8.6). Six alternated full runs, ours / Dynamo, with
//! the tokens asked for 16 ahead in both: 2,048-token query from tokens p99 0.82 -> 0.68 (single
//! runs 0.76-0.86 -> 0.61-0.73), the 96+ walks 0.94 -> 0.79, p50 0.61 -> 0.58. One block in 256
//! measured the same as one in 64 (p99 0.66-0.73 against 0.61-0.68 in the same runs). The key
//! change needs schema 6, whose step drops the derived keys and lets replay rebuild them
//! (`migrations/0006_*`), as schema 5's did.
//!
//! Seven full runs of the final code, load 1.2-1.4, ours / Dynamo: 2,048-token query from tokens
//! p50 0.51-0.62 (2.8-4.0 us); p99 0.54-0.76 in five runs, 0.35 and 0.45 in the other two,
//! where Dynamo's p99 caught machine spikes (27-32 us); best of 3 p99 0.80-0.96; the 96+ walks
//! 0.75-0.80 (three runs);
//! by keys p50 0.56-0.67; apply 1.37-2.05 (6.3-8.4 M block ops/s); a 1M-token full hit from
//! tokens 0.55-1.06 ms; 12.3 B per pair (0.35-0.36).
//!
//! The 1M-token query did not get faster: its table fits in the caches, so neither the
//! prefetching nor the missing lock pays there. What bounds ours now: a walk step is still a
//! hash probe per block (the tree follows an edge
//! it already holds and compares the blocks along it in order), about 35-40 ns per block on a
//! 1M-token prompt whose table fits in the caches, spread over locating, prefetching and
//! probing; the 64 x 2 answer and the cursors' bookkeeping were about a quarter of a 2,048-token
//! query (before the bit sets above). On apply, the table's stores and the alias inserts (one random access each per
//! stored block, both now with their lines prefetched per run or per event) are most of the
//! time. Closing the rest needs blocks that carry their successors, so that a walk along a
//! stored chain reads records in order, without probes.
//!
//! # Where a query's time goes, and what did not help
//!
//! Measured on the side-by-side workload (best of 3-5 alternated runs; the machine's load moved
//! absolute times by up to 2x between runs, so only same-moment comparisons count):
//!
//! - **Per-query buffers.** The cursors' arrays (about 7 KiB for 64 x 2 ranks) and the entry
//!   lists are kept per thread (`query::Scratch`), and a cursor whose holders all stopped
//!   matching ends its remaining phases at once: 2,048-token query by keys 5.28 -> 4.39 us,
//!   from tokens 6.92 -> 6.40 us.
//! - **Hashing in bursts** (`DerivedChain`): a key computed at each walk step waits behind the
//!   walk's misses (22 ns a block inside the walk against 9 ns in a tight loop); linking in
//!   bursts took a 1M-token full hit from tokens 3.97 -> 3.48 ms.
//! - **The tail is long walks.** The slowest queries of the workload (its p99) are the ones
//!   that match 94-128 of their 128 blocks: about 13.5 us for ours, 5-6 us for Dynamo, so
//!   about 100 ns a block once the table is out of the caches, against a tree that reads an
//!   edge's blocks side by side.
//! - **The record the prefetch found is the hint** (`Table::locate_record`): the record
//!   prefetch a few blocks ahead already scans the block's slots to find its record, and the
//!   lookup now reads that record first (taken when it holds the key with a live value, a
//!   probe otherwise), so a step probes the slots once instead of twice: a 1M-token full hit
//!   by keys 2.40 -> 1.56 ms, from tokens 3.08 -> 2.19 ms, a 2,048-token query by keys 4.84 ->
//!   4.57 us (best of 4 alternated runs, table in the caches for the long one).
//! - **Prefetch distances do not move it.** Slot lines 12, 14 or 16 blocks ahead, record lines
//!   2 or 8 ahead, a distance growing with the walk (8 -> 24), refilling the window in chunks:
//!   each within noise or worse on the 2,048-token queries. Dropping the record prefetch made
//!   the 1M-token query (its table in the caches) 2.3 -> 1.4 ms by keys but the 2,048-token
//!   queries (their table evicted by the other index's passes) up to 1.5x slower, so it stays.
//!
//! So what remained was the probe itself: two dependent random lines per block (slot, record)
//! where a tree reads one sequential run per edge. "Segments" below is the structural step
//! named under "Chain hints".
//!
//! # Segments: a prompt's records side by side (schema 5; longer in schema 6)
//!
//! A derived key carries its shard in its top bits and takes them from its parent, except at
//! the first block of a chain and at about one block in 64 chosen by the key's own bits (so by
//! content: every chain through a block agrees). A prompt's blocks therefore come in segments
//! of about 64 in one shard, and since a shard hands out records in order (free records first,
//! then new ones), the blocks of a segment that one store run brought are neighbouring
//! records. The walk, locating a block a few steps ahead, first reads the record after the one
//! of the block before it (`Table::locate_record_after`, and `Located::after` for the first
//! blocks): a key check on a line that is usually in the caches already, instead of a slot
//! line and then a record line. Any other record, or a block of another shard, takes the slots
//! as before, and the lookup still checks the hint by key and live value, so a guess can only
//! cost time.
//!
//! Measured on the side-by-side workload: 94 % of the blocks a walk looked up were in the shard of
//! the block before, and 78 % were found by the record after their predecessor's (91 % of the
//! guesses tried; most failures follow evictions, whose freed records later stores reuse). Profile
//! mode, thread CPU per query, best of 3 alternated runs at load 3-5 (schema 4's keys and digest ->
//! segments and the packed digest): 1M-token full hit by keys 1.42 -> 0.80 ms, from tokens
//! 2.10-2.86 -> 1.21-1.55 ms; 2,048-token queries about 10 % (by keys 4.49-4.90 -> 3.9-4.4 us, from
//! tokens 6.2-7.3 -> 5.6-6.6 us). Apply gains as much (an engine message's blocks fall into a few
//! shard groups, each one lock and one write section, instead of one or two blocks in each of ~50):
//! ratio to Dynamo in three alternated full runs 1.10, 1.08, 1.37 -> 1.29, 1.27, 1.19, and
//! 1.43-1.62 with "Apply" below. Tried and not kept: not prefetching the slot line of a block
//! expected to follow its predecessor, and prefetching the record line after a followed record
//! (both within noise).
//!
//! **Following a run.** The guess still costs a walk step per block. So after a block whose
//! value did not change, the walk checks the next blocks whose keys the chain has already
//! linked against the records after the block's own, up to `query::FOLLOW_MAX` (64) in one
//! validated read of the shard (`Table::follow`): each must hold its key with the same value
//! (and, for a set value, no set reused in between), which is exactly what the walk step would
//! have found, so the counts are those of the step-by-step walk. The first block that is not the
//! next record, or differs, goes through the normal step. A writer's section in that shard makes
//! the read retry, as any lookup's. Profile mode, thread CPU, best of 3 alternated runs: 1M-token
//! full hit by keys 1.08 -> 0.36 ms, from tokens 1.28 -> 0.80 ms; 2,048-token queries by keys
//! 4.93 -> 4.22 us, from tokens 6.85 -> 5.99 us. Three alternated full runs, ours / Dynamo, before
//! -> after: 2,048-token query from tokens p50 1.13-1.24 -> 0.90-1.03, p99 0.98-1.26 -> 1.01-1.19
//! (best of 3: 1.32-1.46 -> 1.05-1.30); 1M-token full hit from tokens 1.61-2.45 -> 1.09-1.48 ms.
//!
//! **No slot prefetch inside a segment.** A block in its predecessor's shard is most likely
//! followed or found in the record after its predecessor's, so the walk does not prefetch its
//! slot line; the record guess a few blocks ahead brings the line in only when it fails
//! (`Table::guess_record_after`). On the workload's queries that match 96 or more blocks:
//! cachegrind per query 42.8 -> 40.5 k instructions, 382 -> 341 first-level misses; thread CPU,
//! best of 3 alternated: 5.47 -> 4.51 us.
//!
//! Costs: none in memory (no hint is stored), none on exactness (keys stay 64 bits; the shard
//! bits are the parent's, the other 58 the block's own). A shard takes as many blocks as the
//! segments that fall in it; segments start at random, so shards stay even. A restart
//! rebuilds each shard with its records in slot order, not store order, so walks over restored
//! blocks take the slots as before until new stores bring runs again. The key change needs
//! schema 5 (`migrations/0005_*`).
//!
//! # Apply
//!
//! An engine message is one batch of about 70 blocks (6 events of 8-16), and 92 % of its stores
//! join a block other holders already have. Measured with `dynamo-compare --profile apply`
//! (fastest of 5 builds in thread CPU time, binaries alternated) and full runs (ours / Dynamo,
//! same run), this is what a batch paid for and what was done:
//! - per-batch allocations (the store run's vectors, each op's keys, the removal buffers):
//!   about a tenth of apply in malloc and free; now buffers of the context, trimmed after an
//!   unusually large batch;
//! - alias inserts per store op right after prefetching their lines, which had not arrived (the
//!   insert's load was 60 % of it): now gathered with the run (`keying::PendingAliases`) and
//!   inserted after the run's record prefetches, each line prefetched when its op is keyed, as
//!   is each key's slot line. With the first: 768-874 → 650-729 ms of wall time;
//! - the sets' writer mutex locked per shard group, which for a message is about one per store:
//!   now once per run (`table::Table::writer`); removal events now prefetch every alias, slot
//!   and record line before removing (each remove was three dependent misses): CPU 622-689 →
//!   526-552 ms;
//! - each batch cloned and hashed its holder's key twice (interning, listing its rank): now
//!   found among its source's holders first.
//!
//! Six full runs of each, alternated, at load 1-3: ours 0.69-1.03 s → 0.54-0.74 s for the
//! 3.17 M block ops (3.1-4.6 → 4.3-5.8 M ops/s, 1.3x on average), ratio to Dynamo in the same
//! runs 0.72-1.35 → 0.90-1.22 (per CPU-second 0.78-1.24 → 0.95-1.29): Dynamo itself ran at
//! 3.4-5.4 M ops/s across those runs, so the ratio of one run says little. What bounds
//! ours now: three random lines per stored block (alias slot, table slot, record) with the
//! memory system already full of prefetches (the prefetch instructions themselves take
//! samples), three locked instructions per shard group (shard lock, the readers' write
//! section, unlock) for groups of one or two stores (a message's blocks spread over 64 shards),
//! and the holder-set transitions (a new set per holder joining a prompt, the old one freed).
//!
//! Then the store path itself, measured the same way (CPU best of 5 builds, alternated) and by
//! instruction counts (cachegrind, which the machine's load does not move; apply's functions
//! only):
//! - each stored block's slot hash was computed four times (slot prefetch, record prefetch,
//!   shard of the counting sort, the probe in `Shard::add_at`), and the record the prefetch
//!   found was thrown away: now each gathered store keeps one `table::Located` from its slot
//!   prefetch on, with the record found as a hint, and `add_at` takes a live record holding the
//!   key as the block's (validated as the readers validate theirs) and probes otherwise (92 %
//!   of the stores join an existing block). CPU -8 to -12 % in alternated runs;
//! - the records were looked up for the whole run at its end, when the last op's slot lines had
//!   not arrived, and all prefetched at once: now one op after their slots
//!   (`StoreRun::find_records`), and the counting sort moves 4-byte positions, not 32-byte items;
//! - most joins repeat the last transition (a holder storing a prompt moves each of its blocks
//!   from the prompt's set to the same next one): the last join is taken again without the
//!   transition cache's lookup, and the reference moves of all of them are applied at once
//!   (`table::sets`, `LastJoin`);
//! - alias inserts and reverse-list pushes were calls per block for a room check: inlined, the
//!   growth out of line.
//!
//! Together: 13.9 → 9.9 G instructions for the 5 builds (-28 %), CPU best 546 → 431 ms
//! (median 564 → 454, five alternated runs at load 3). What bounds apply now: the three random
//! lines per stored block (alias slot, table slot, record); the derived-key chain of each
//! block; the shard groups' locks (one or two stores per group for a message spread over 64
//! shards: `Table::write` and the end of its write section are 6 % of the instructions), and
//! per batch the source's holder and rank look-ups (two SipHashes of its key).

pub mod actor;
mod alias_table;
mod aliases;
mod answer;
pub mod budget;
pub mod context;
mod cursors;
pub mod directory;
mod evict_order;
pub mod export;
pub mod handle;
mod holder;
mod image;
mod keying;
mod plan;
mod prompt_keys;
pub mod query;
mod records;
mod refs;
mod shared;
mod snapshot;
pub mod sorted_map;
mod store_run;
mod table;

#[cfg(test)]
mod keys_tests;
#[cfg(test)]
mod model_check;
#[cfg(test)]
mod order_fixture;
#[cfg(test)]
mod order_props;
#[cfg(test)]
mod order_tests;
#[cfg(test)]
mod tests;

pub use actor::{
    ApplyBatch, AttachRank, ContextActor, ContextHandle, DetachOutcome, DetachSource, DropSource,
    GetStats, Snapshot,
};
pub use answer::{InstanceHits, QueryHits, TierCounts};
pub use budget::Budget;
pub use context::restore::{AliasLoader, PairBatch, Restorer};
pub use context::{ApplyReport, ContextIndex};
pub use directory::{ArbiterPool, ContextDirectory, ProfileConflict};
pub use handle::{ContextView, IndexReader, IndexStats};
pub use image::{ContextChanges, HolderRecord, Watermark, payload_digest};
pub use query::HashList;
pub use records::{Attachment, PairBits};
pub use snapshot::ContextSnapshot;
pub use sorted_map::SortedMap;
