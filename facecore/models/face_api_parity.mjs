// The published face-api model run by the package's own JavaScript (tf.js, pure-JS CPU backend),
// for the torch port's parity test:
//   node face_api_parity.mjs PACKAGE_DIR INPUT.f32 N OUTPUT.f32
// INPUT holds N RGB faces of 150x150x3 float32 pixels in [0, 255] (NHWC); OUTPUT gets N x 128
// float32 descriptors, exactly as FaceRecognitionNet computes them. Nothing is downloaded.
import fs from 'fs';

const [, , packageDir, inputPath, count, outputPath] = process.argv;
// The bundle is built for browsers: it stubs node's `util`, so it must not detect node while it
// initialises. tf.js then gets a minimal platform, and face-api an environment without a canvas.
const nodeProcess = globalThis.process;
globalThis.process = undefined;
const faceapi = await import(`${packageDir}/dist/face-api.esm.js`);
globalThis.process = nodeProcess;
const { tf } = faceapi;
tf.setPlatform('node', {
  fetch: globalThis.fetch,
  now: () => performance.now(),
  encode: (text) => new TextEncoder().encode(text),
  decode: (bytes, encoding) => new TextDecoder(encoding).decode(bytes),
  isTypedArray: (value) => ArrayBuffer.isView(value) && !(value instanceof DataView),
});
const unavailable = (what) => () => { throw new Error(`no ${what} in this harness`); };
class None {}
faceapi.env.setEnv({
  Canvas: None, CanvasRenderingContext2D: None, Image: None, ImageData: None, Video: None,
  createCanvasElement: unavailable('canvas'), createImageElement: unavailable('image'),
  createVideoElement: unavailable('video'), fetch: globalThis.fetch, readFile: unavailable('file system'),
});
await tf.setBackend('cpu');
await tf.ready();

const manifest = JSON.parse(fs.readFileSync(`${packageDir}/model/face_recognition_model-weights_manifest.json`));
const weights = fs.readFileSync(`${packageDir}/model/face_recognition_model.bin`);
const net = new faceapi.FaceRecognitionNet();
net.loadFromWeightMap(tf.io.decodeWeights(
  weights.buffer.slice(weights.byteOffset, weights.byteOffset + weights.byteLength), manifest[0].weights,
));
const n = Number(count);
const pixels = fs.readFileSync(inputPath);
const faces = tf.tensor4d(new Float32Array(pixels.buffer, pixels.byteOffset, n * 150 * 150 * 3), [n, 150, 150, 3]);
const descriptors = net.forwardInput(await faceapi.toNetInput(tf.unstack(faces)));
fs.writeFileSync(outputPath, Buffer.from((await descriptors.data()).buffer));
console.log(`face-api ${faceapi.version} on tf.js ${tf.version_core} (${tf.getBackend()}): ${n} descriptors`);
