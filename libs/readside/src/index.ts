export { AnswerPusher } from './answer-pusher.js';
