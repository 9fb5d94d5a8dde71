package io.kcs.standin;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;

import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.core.ResponseInputStream;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.http.apache.ApacheHttpClient;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.model.CompleteMultipartUploadRequest;
import software.amazon.awssdk.services.s3.model.CompletedMultipartUpload;
import software.amazon.awssdk.services.s3.model.CompletedPart;
import software.amazon.awssdk.services.s3.model.Delete;
import software.amazon.awssdk.services.s3.model.DeleteObjectsRequest;
import software.amazon.awssdk.services.s3.model.GetObjectRequest;
import software.amazon.awssdk.services.s3.model.GetObjectResponse;
import software.amazon.awssdk.services.s3.model.NoSuchKeyException;
import software.amazon.awssdk.services.s3.model.ObjectIdentifier;
import software.amazon.awssdk.services.s3.model.S3Exception;

/**
 * A STAND-IN for Aiven's tiered-storage plugin ({@code RemoteStorageManager} with its S3
 * storage backend), for the project's real-broker tests, demo and benchmark: the plugin's
 * artifacts are not served by the package registry the project's machines reach, so the
 * broker loads this instead. It keeps the plugin's object layout and its request pattern
 * at the S3 endpoint, which is all the sidecar sees of it:
 *
 * <ul>
 *   <li>keys {@code {key.prefix}{topic}-{topicId}/{partition}/{startOffset:020d}-{segmentId}.{log|indexes|rsm-manifest}};
 *   <li>uploads: the segment as one PutObject, or multipart in {@code storage.s3.multipart.upload.part.size}
 *       parts when larger, then {@code .indexes} (the indexes back to back) and the JSON
 *       {@code .rsm-manifest}, with the SDK's default checksums;
 *   <li>reads: the manifest GET whole (once a segment: it is kept in a small bounded map, as
 *       the plugin's manifest cache does), an index by a closed range of {@code .indexes}, and
 *       the log as one closed-range GET per {@code chunk.size} chunk, each read whole, no chunk
 *       cache (the plugin's default): a reader consuming 1 MiB asks for the whole chunk again;
 *   <li>optionally, with {@code chunk.cache.path} set, the log's chunks through
 *       {@link StandInDiskChunkCache}, a stand-in for the plugin's {@code DiskChunkCache} with
 *       prefetching ({@code chunk.cache.size}, {@code chunk.cache.prefetch.max.size}): chunk
 *       files on the broker's disk, a miss fetching the chunks after it too;
 *   <li>deletes: one DeleteObjects of the three keys;
 *   <li>AWS SDK v2's synchronous client on the pooled Apache HTTP client (50 connections).
 * </ul>
 *
 * Configured under the broker's {@code rsm.config.} prefix with the plugin's own names:
 * {@code storage.s3.endpoint.url}, {@code storage.s3.bucket.name}, {@code storage.s3.region},
 * {@code storage.s3.path.style.access.enabled}, {@code storage.aws.access.key.id},
 * {@code storage.aws.secret.access.key}, {@code chunk.size}, {@code key.prefix}, and for the
 * chunk cache {@code chunk.cache.path}, {@code chunk.cache.size} (bytes, default 1 GiB) and
 * {@code chunk.cache.prefetch.max.size} (bytes, default 0). No compression or encryption (the
 * plugin's defaults).
 */
public final class StandInRemoteStorageManager implements RemoteStorageManager {
    private static final int MANIFESTS_KEPT = 1000;
    private static final ObjectMapper JSON = new ObjectMapper();
    // The order of the indexes in .indexes, as the plugin writes them.
    private static final String[] INDEX_NAMES = {
        "offset", "timestamp", "producerSnapshot", "transaction", "leaderEpoch"};

    private S3Client s3;
    private String bucket;
    private String prefix;
    private int chunkSize;
    private long partSize;
    // The stand-in for the plugin's DiskChunkCache; null without chunk.cache.path (the default).
    private StandInDiskChunkCache chunkCache;
    private final Map<String, JsonNode> manifests = Collections.synchronizedMap(
        new LinkedHashMap<>(16, 0.75f, true) {
            @Override
            protected boolean removeEldestEntry(final Map.Entry<String, JsonNode> eldest) {
                return size() > MANIFESTS_KEPT;
            }
        });

    @Override
    public void configure(final Map<String, ?> configs) {
        bucket = required(configs, "storage.s3.bucket.name");
        prefix = optional(configs, "key.prefix", "");
        chunkSize = Integer.parseInt(optional(configs, "chunk.size", String.valueOf(4 << 20)));
        partSize = Long.parseLong(optional(configs, "storage.s3.multipart.upload.part.size",
            String.valueOf(25L << 20)));
        s3 = S3Client.builder()
            .endpointOverride(URI.create(required(configs, "storage.s3.endpoint.url")))
            .region(Region.of(optional(configs, "storage.s3.region", "us-east-1")))
            .forcePathStyle(Boolean.parseBoolean(
                optional(configs, "storage.s3.path.style.access.enabled", "true")))
            .credentialsProvider(StaticCredentialsProvider.create(AwsBasicCredentials.create(
                required(configs, "storage.aws.access.key.id"),
                required(configs, "storage.aws.secret.access.key"))))
            .httpClientBuilder(ApacheHttpClient.builder().maxConnections(50)
                .connectionTimeout(Duration.ofSeconds(5)).socketTimeout(Duration.ofSeconds(30)))
            .build();
        final String cachePath = optional(configs, "chunk.cache.path", "");
        if (!cachePath.isEmpty()) {
            try {
                chunkCache = new StandInDiskChunkCache(Path.of(cachePath),
                    Long.parseLong(optional(configs, "chunk.cache.size", String.valueOf(1L << 30))),
                    Long.parseLong(optional(configs, "chunk.cache.prefetch.max.size", "0")),
                    this::open);
            } catch (final IOException e) {
                throw new IllegalArgumentException("rsm.config.chunk.cache.path " + cachePath
                    + " is not a usable directory: " + e, e);
            }
        }
    }

    private static String required(final Map<String, ?> configs, final String name) {
        final Object value = configs.get(name);
        if (value == null || value.toString().isEmpty()) {
            throw new IllegalArgumentException("rsm.config." + name + " must be set");
        }
        return value.toString();
    }

    private static String optional(final Map<String, ?> configs, final String name,
                                   final String fallback) {
        final Object value = configs.get(name);
        return value == null ? fallback : value.toString();
    }

    private String key(final RemoteLogSegmentMetadata metadata, final String suffix) {
        final TopicIdPartition partition = metadata.remoteLogSegmentId().topicIdPartition();
        return String.format("%s%s-%s/%d/%020d-%s.%s", prefix, partition.topic(),
            partition.topicId(), partition.partition(), metadata.startOffset(),
            metadata.remoteLogSegmentId().id(), suffix);
    }

    @Override
    public Optional<CustomMetadata> copyLogSegmentData(final RemoteLogSegmentMetadata metadata,
                                                       final LogSegmentData data)
        throws RemoteStorageException {
        try {
            final long logSize = Files.size(data.logSegment());
            uploadFile(key(metadata, "log"), data.logSegment(), logSize);

            final ByteArrayOutputStream indexes = new ByteArrayOutputStream();
            final ObjectNode positions = JSON.createObjectNode();
            final Map<String, byte[]> bodies = new LinkedHashMap<>();
            bodies.put("offset", Files.readAllBytes(data.offsetIndex()));
            bodies.put("timestamp", Files.readAllBytes(data.timeIndex()));
            bodies.put("producerSnapshot", Files.readAllBytes(data.producerSnapshotIndex()));
            bodies.put("transaction", data.transactionIndex().isPresent()
                ? Files.readAllBytes(data.transactionIndex().get()) : null);
            final ByteBuffer epochs = data.leaderEpochIndex().duplicate();
            final byte[] epochBytes = new byte[epochs.remaining()];
            epochs.get(epochBytes);
            bodies.put("leaderEpoch", epochBytes);
            for (final String name : INDEX_NAMES) {
                final byte[] body = bodies.get(name);
                if (body == null) {
                    positions.putNull(name);
                    continue;
                }
                positions.putObject(name).put("position", indexes.size()).put("size", body.length);
                indexes.write(body);
            }
            s3.putObject(b -> b.bucket(bucket).key(key(metadata, "indexes")),
                RequestBody.fromBytes(indexes.toByteArray()));

            final ObjectNode manifest = JSON.createObjectNode();
            manifest.put("version", "1");
            final long lastChunk = logSize - (Math.max(0, logSize - 1) / chunkSize) * chunkSize;
            manifest.putObject("chunkIndex").put("type", "fixed")
                .put("originalChunkSize", chunkSize).put("originalFileSize", logSize)
                .put("transformedChunkSize", chunkSize).put("finalTransformedChunkSize", lastChunk);
            manifest.set("segmentIndexes", positions);
            manifest.put("compression", false);
            s3.putObject(b -> b.bucket(bucket).key(key(metadata, "rsm-manifest")),
                RequestBody.fromBytes(JSON.writeValueAsBytes(manifest)));
            return Optional.empty();
        } catch (final IOException | S3Exception e) {
            throw new RemoteStorageException("copying " + key(metadata, "log") + ": " + e, e);
        }
    }

    private void uploadFile(final String key, final Path file, final long size) throws IOException {
        if (size <= partSize) {
            s3.putObject(b -> b.bucket(bucket).key(key), RequestBody.fromFile(file));
            return;
        }
        final String uploadId = s3.createMultipartUpload(b -> b.bucket(bucket).key(key)).uploadId();
        final List<CompletedPart> parts = new ArrayList<>();
        try (InputStream in = Files.newInputStream(file)) {
            for (int number = 1; ; number++) {
                final byte[] part = in.readNBytes((int) partSize);
                if (part.length == 0) {
                    break;
                }
                final int partNumber = number;
                final String etag = s3.uploadPart(b -> b.bucket(bucket).key(key)
                    .uploadId(uploadId).partNumber(partNumber), RequestBody.fromBytes(part)).eTag();
                parts.add(CompletedPart.builder().partNumber(partNumber).eTag(etag).build());
            }
        } catch (final IOException | RuntimeException e) {
            s3.abortMultipartUpload(b -> b.bucket(bucket).key(key).uploadId(uploadId));
            throw e;
        }
        s3.completeMultipartUpload(CompleteMultipartUploadRequest.builder().bucket(bucket).key(key)
            .uploadId(uploadId).multipartUpload(CompletedMultipartUpload.builder().parts(parts).build())
            .build());
    }

    private JsonNode manifest(final RemoteLogSegmentMetadata metadata) throws RemoteStorageException {
        final String key = key(metadata, "rsm-manifest");
        final JsonNode kept = manifests.get(key);
        if (kept != null) {
            return kept;
        }
        try {
            final JsonNode manifest = JSON.readTree(get(key, null));
            manifests.put(key, manifest);
            return manifest;
        } catch (final IOException e) {
            throw new RemoteStorageException("reading " + key + ": " + e, e);
        }
    }

    /** One GetObject, whole or of the closed range [first, last] (RFC 9110, 14.1.2). A range
     *  is read as the plugin reads a chunk: into an array of its size, one copy from the
     *  socket. */
    private byte[] get(final String key, final long[] range) throws RemoteStorageException {
        final GetObjectRequest.Builder request = GetObjectRequest.builder().bucket(bucket).key(key);
        if (range != null) {
            request.range("bytes=" + range[0] + "-" + range[1]);
        }
        try (ResponseInputStream<GetObjectResponse> body = s3.getObject(request.build())) {
            if (range == null) {
                return body.readAllBytes();
            }
            final byte[] bytes = new byte[(int) (range[1] - range[0] + 1)];
            final int read = body.readNBytes(bytes, 0, bytes.length);
            if (read != bytes.length) {
                throw new RemoteStorageException("reading " + key + ": " + read + " of "
                    + bytes.length + " bytes");
            }
            return bytes;
        } catch (final NoSuchKeyException e) {
            throw new RemoteResourceNotFoundException("no object " + key, e);
        } catch (final IOException | RuntimeException e) {
            throw new RemoteStorageException("reading " + key + ": " + e, e);
        }
    }

    /** The closed range [first, last] of an object as a stream (the chunk cache's GETs). */
    private InputStream open(final String key, final long first, final long last)
        throws RemoteStorageException {
        try {
            return s3.getObject(GetObjectRequest.builder().bucket(bucket).key(key)
                .range("bytes=" + first + "-" + last).build());
        } catch (final NoSuchKeyException e) {
            throw new RemoteResourceNotFoundException("no object " + key, e);
        } catch (final RuntimeException e) {
            throw new RemoteStorageException("reading " + key + ": " + e, e);
        }
    }

    @Override
    public InputStream fetchLogSegment(final RemoteLogSegmentMetadata metadata,
                                       final int startPosition) throws RemoteStorageException {
        return fetchLogSegment(metadata, startPosition, Integer.MAX_VALUE);
    }

    @Override
    public InputStream fetchLogSegment(final RemoteLogSegmentMetadata metadata,
                                       final int startPosition, final int endPosition)
        throws RemoteStorageException {
        final JsonNode chunks = manifest(metadata).get("chunkIndex");
        final long size = chunks.get("originalFileSize").asLong();
        final long chunk = chunks.get("originalChunkSize").asLong();
        final long end = Math.min((long) endPosition, size - 1);
        if (startPosition < 0 || startPosition > end) {
            return new ByteArrayInputStream(new byte[0]);
        }
        final String key = key(metadata, "log");
        // The chunks are fetched one at a time as the reader gets to them, each whole; a
        // reader that stops early (the broker reads one fetch's worth) fetches no more.
        return new InputStream() {
            private long next = startPosition / chunk;
            private final long last = end / chunk;
            private InputStream current = new ByteArrayInputStream(new byte[0]);

            private boolean advance() throws IOException {
                while (current.available() == 0) {
                    if (next > last) {
                        return false;
                    }
                    final long first = next * chunk;
                    final long stop = Math.min(first + chunk, size) - 1;
                    next++;
                    final byte[] bytes;
                    if (chunkCache != null) {
                        bytes = chunkCache.chunk(key, next - 1, chunk, size);
                    } else {
                        try {
                            bytes = get(key, new long[] {first, stop});
                        } catch (final RemoteStorageException e) {
                            throw new IOException(e.getMessage(), e);
                        }
                    }
                    final int from = (int) Math.max(0, startPosition - first);
                    final int to = (int) (Math.min(stop, end) - first + 1);
                    current = new ByteArrayInputStream(bytes, from, to - from);
                }
                return true;
            }

            @Override
            public int read() throws IOException {
                return advance() ? current.read() : -1;
            }

            @Override
            public int read(final byte[] buffer, final int offset, final int length)
                throws IOException {
                if (length == 0) {
                    return 0;
                }
                return advance() ? current.read(buffer, offset, length) : -1;
            }
        };
    }

    @Override
    public InputStream fetchIndex(final RemoteLogSegmentMetadata metadata, final IndexType indexType)
        throws RemoteStorageException {
        final String name;
        switch (indexType) {
            case OFFSET: name = "offset"; break;
            case TIMESTAMP: name = "timestamp"; break;
            case PRODUCER_SNAPSHOT: name = "producerSnapshot"; break;
            case TRANSACTION: name = "transaction"; break;
            case LEADER_EPOCH: name = "leaderEpoch"; break;
            default: throw new IllegalArgumentException("unknown index " + indexType);
        }
        final JsonNode position = manifest(metadata).get("segmentIndexes").get(name);
        if (position == null || position.isNull()) {
            throw new RemoteResourceNotFoundException("segment has no " + name + " index");
        }
        final long first = position.get("position").asLong();
        final long length = position.get("size").asLong();
        if (length == 0) {
            return new ByteArrayInputStream(new byte[0]);
        }
        return new ByteArrayInputStream(
            get(key(metadata, "indexes"), new long[] {first, first + length - 1}));
    }

    @Override
    public void deleteLogSegmentData(final RemoteLogSegmentMetadata metadata)
        throws RemoteStorageException {
        final List<ObjectIdentifier> keys = new ArrayList<>();
        for (final String suffix : new String[] {"log", "indexes", "rsm-manifest"}) {
            keys.add(ObjectIdentifier.builder().key(key(metadata, suffix)).build());
        }
        try {
            s3.deleteObjects(DeleteObjectsRequest.builder().bucket(bucket)
                .delete(Delete.builder().objects(keys).build()).build());
        } catch (final S3Exception e) {
            throw new RemoteStorageException("deleting " + key(metadata, "log") + ": " + e, e);
        }
        manifests.remove(key(metadata, "rsm-manifest"));
    }

    @Override
    public void close() {
        if (chunkCache != null) {
            chunkCache.close();
        }
        if (s3 != null) {
            s3.close();
        }
    }
}
