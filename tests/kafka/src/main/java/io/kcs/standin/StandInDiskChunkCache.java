package io.kcs.standin;

import org.apache.kafka.server.log.remote.storage.RemoteStorageException;

import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A STAND-IN for the {@code DiskChunkCache} of Aiven's tiered-storage plugin, with its
 * prefetching on: the cache that plugin keeps of {@code .log} chunks on the broker's own
 * disk. The broker benchmark's {@code plugin-cache} row runs the stand-in remote storage
 * manager with it, to compare the sidecar with what the plugin does on its own. It is
 * not Aiven's code (that is not available here) but does what its documentation
 * describes, with the same setting names under {@code rsm.config.}:
 *
 * <ul>
 *   <li>{@code chunk.cache.path}: each chunk of a segment's {@code .log} is a file in this
 *       directory once fetched;
 *   <li>{@code chunk.cache.prefetch.max.size}: a miss fetches the chunk and the chunks after
 *       it, up to this many bytes more (stopping before one already cached or on its way),
 *       with one closed-range GET; the reader gets its chunk as soon as that has arrived and
 *       the rest land in the cache as the response goes on (the plugin prefetches in the
 *       background too);
 *   <li>a chunk on its way is waited for, never fetched twice at once;
 *   <li>{@code chunk.cache.size}: at most this many bytes of chunk files, the least recently
 *       used removed first.
 * </ul>
 *
 * Not modelled: the plugin's time-based retention of chunk files and its Caffeine
 * (W-TinyLFU) admission policy; eviction here is plain LRU.
 */
final class StandInDiskChunkCache implements AutoCloseable {
    /** Opens the closed byte range [first, last] of an object. */
    interface RangeReader {
        InputStream open(String key, long first, long last) throws RemoteStorageException;
    }

    private final Path directory;
    private final long maxBytes;
    private final long prefetchBytes;
    private final RangeReader reader;
    private final AtomicInteger threads = new AtomicInteger();
    private final ExecutorService fetchers = Executors.newCachedThreadPool(task -> {
        final Thread thread = new Thread(task, "chunk-cache-fetch-" + threads.incrementAndGet());
        thread.setDaemon(true);
        return thread;
    });
    private final Object lock = new Object();
    // Chunk id -> file size, least recently used first (get() marks a chunk used).
    private final LinkedHashMap<String, Long> cached = new LinkedHashMap<>(16, 0.75f, true);
    private final Map<String, CompletableFuture<byte[]>> inFlight = new HashMap<>();
    private long cachedBytes;

    StandInDiskChunkCache(final Path directory, final long maxBytes, final long prefetchBytes,
                          final RangeReader reader) throws IOException {
        this.directory = Files.createDirectories(directory);
        this.maxBytes = maxBytes;
        this.prefetchBytes = prefetchBytes;
        this.reader = reader;
    }

    /** Chunk {@code index} of the object {@code key}, which is {@code size} bytes long and
     *  cut into chunks of {@code chunkSize} bytes. */
    byte[] chunk(final String key, final long index, final long chunkSize, final long size)
        throws IOException {
        while (true) {
            final String id = id(key, index);
            final CompletableFuture<byte[]> pending;
            synchronized (lock) {
                if (cached.get(id) != null) {
                    pending = null;
                } else if (inFlight.containsKey(id)) {
                    pending = inFlight.get(id);
                } else {
                    pending = startFetch(key, index, chunkSize, size);
                }
            }
            if (pending == null) {
                try {
                    return Files.readAllBytes(file(id));
                } catch (final NoSuchFileException evicted) {
                    synchronized (lock) {
                        forget(id);
                    }
                    continue; // removed between the lookup and the read: a miss after all
                }
            }
            try {
                return pending.get();
            } catch (final InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new InterruptedIOException("waiting for chunk " + index + " of " + key);
            } catch (final ExecutionException e) {
                throw new IOException("fetching chunk " + index + " of " + key + ": "
                    + e.getCause(), e.getCause());
            }
        }
    }

    // Called holding the lock: registers the window's chunks as on their way and starts the GET.
    private CompletableFuture<byte[]> startFetch(final String key, final long index,
                                                 final long chunkSize, final long size) {
        final long lastChunk = (size - 1) / chunkSize;
        final long ahead = (prefetchBytes + chunkSize - 1) / chunkSize;
        final List<CompletableFuture<byte[]>> window = new ArrayList<>();
        for (long chunk = index; chunk <= Math.min(lastChunk, index + ahead); chunk++) {
            final String id = id(key, chunk);
            if (chunk > index && (cached.containsKey(id) || inFlight.containsKey(id))) {
                break;
            }
            final CompletableFuture<byte[]> future = new CompletableFuture<>();
            inFlight.put(id, future);
            window.add(future);
        }
        fetchers.execute(() -> fetch(key, index, window, chunkSize, size));
        return window.get(0);
    }

    private void fetch(final String key, final long index,
                       final List<CompletableFuture<byte[]>> window, final long chunkSize,
                       final long size) {
        final long first = index * chunkSize;
        final long last = Math.min((index + window.size()) * chunkSize, size) - 1;
        int done = 0;
        try (InputStream body = reader.open(key, first, last)) {
            for (; done < window.size(); done++) {
                final long chunk = index + done;
                final int length = (int) (Math.min((chunk + 1) * chunkSize, size) - chunk * chunkSize);
                final byte[] bytes = body.readNBytes(length);
                if (bytes.length != length) {
                    throw new IOException("the GET of " + key + " ended " + (length - bytes.length)
                        + " bytes short in chunk " + chunk);
                }
                store(id(key, chunk), bytes);
                window.get(done).complete(bytes);
            }
        } catch (final IOException | RemoteStorageException | RuntimeException e) {
            synchronized (lock) {
                for (int failed = done; failed < window.size(); failed++) {
                    inFlight.remove(id(key, index + failed));
                }
            }
            for (int failed = done; failed < window.size(); failed++) {
                window.get(failed).completeExceptionally(e);
            }
        }
    }

    private void store(final String id, final byte[] bytes) {
        final Path path = file(id);
        boolean written;
        try {
            final Path partial = path.resolveSibling(path.getFileName() + ".partial");
            Files.write(partial, bytes);
            Files.move(partial, path, StandardCopyOption.ATOMIC_MOVE,
                StandardCopyOption.REPLACE_EXISTING);
            written = true;
        } catch (final IOException e) {
            written = false; // a full or failing cache disk: the reader still gets the chunk
        }
        synchronized (lock) {
            inFlight.remove(id);
            if (!written) {
                return;
            }
            forget(id);
            cached.put(id, (long) bytes.length);
            cachedBytes += bytes.length;
            final Iterator<Map.Entry<String, Long>> oldest = cached.entrySet().iterator();
            while (cachedBytes > maxBytes && oldest.hasNext()) {
                final Map.Entry<String, Long> entry = oldest.next();
                if (entry.getKey().equals(id)) {
                    continue; // the chunk just stored stays, even in a cache smaller than it
                }
                cachedBytes -= entry.getValue();
                oldest.remove();
                try {
                    Files.deleteIfExists(file(entry.getKey()));
                } catch (final IOException e) {
                    // Left behind on a failing disk; no longer counted or served.
                }
            }
        }
    }

    // Called holding the lock.
    private void forget(final String id) {
        final Long size = cached.remove(id);
        if (size != null) {
            cachedBytes -= size;
        }
    }

    private static String id(final String key, final long chunk) {
        return key.replace('/', '_') + "." + chunk;
    }

    private Path file(final String id) {
        return directory.resolve(id);
    }

    @Override
    public void close() {
        fetchers.shutdownNow();
    }
}
